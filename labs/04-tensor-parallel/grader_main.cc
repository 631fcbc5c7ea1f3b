// lab_04: lab 4's grader on tp_linear.cc (the exercise, the reference solution,
// or the course's NaN test).
#include "labs/04-tensor-parallel/grader.h"
#include "labs/04-tensor-parallel/tp_linear.h"
#include "labs/common/grade.h"

int main(int argc, char** argv) {
  using namespace shardlab::labs;
  return run_grader(
      4, "",
      [](int, char**) {
        return grade_tp_linear({column_parallel_forward, column_parallel_backward, row_parallel_forward,
                                row_parallel_backward});
      },
      argc, argv);
}
