// lab_05: lab 5's grader on schedules.cc (the exercise, or the reference solution).
#include "labs/05-pipeline-schedules/grader.h"
#include "labs/05-pipeline-schedules/schedules.h"
#include "labs/common/grade.h"

int main(int argc, char** argv) {
  using namespace shardlab::labs;
  return run_grader(5, "", [](int, char**) { return grade_schedules(lab_gpipe, lab_one_f_one_b); }, argc, argv);
}
