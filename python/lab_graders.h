// The code labs' graders on Python functions (labs/README.md): a notebook of
// lab 2, 4 or 5 hands its functions to the checks `make lab-N` runs on the
// C++ exercise (labs/NN-*/grader.h), adapted here to their signatures.
#pragma once

#include <pybind11/pybind11.h>

namespace shardlab::python {

// grade_lab_02(ring_all_reduce), grade_lab_04(column_forward, column_backward,
// row_forward, row_backward), grade_lab_05(gpipe, one_f_one_b): each the
// run_interruptible dict, json {"report": the grader's text}, code 0 (PASS) or 1;
// also lab 5's Action and its helpers forward_actions / backward_actions.
void add_lab_graders(pybind11::module_& m);

}  // namespace shardlab::python
