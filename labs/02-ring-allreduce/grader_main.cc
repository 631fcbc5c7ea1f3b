// lab_02: lab 2's grader on ring_allreduce.cc (the exercise, or the reference solution).
#include "labs/02-ring-allreduce/grader.h"
#include "labs/02-ring-allreduce/ring_allreduce.h"
#include "labs/common/grade.h"

int main(int argc, char** argv) {
  using namespace shardlab::labs;
  return run_grader(2, "", [](int, char**) { return grade_ring_all_reduce(ring_all_reduce); }, argc, argv);
}
