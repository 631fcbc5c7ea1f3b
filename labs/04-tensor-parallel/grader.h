// Lab 4's checks (grader.cc) on any four tensor-parallel layer functions: the
// C++ exercise's (grader_main.cc, `make lab-4`) or a notebook's Python
// functions (python/lab_graders.cc). One grader, so both are held to the
// same tolerances and virtual times.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "collectives/group.h"
#include "runtime/device.h"

namespace shardlab::labs {

// The signatures of tp_linear.h: (dev, tp, out, inp, weight, bias, N, C, OC)
// and (dev, tp, dinp, dweight, dbias, dout, inp, weight, N, C, OC), with the
// split dimension already divided by tp.
using TpForward = std::function<void(Device&, const collectives::ProcessGroup&, float*, const float*,
                                     const float*, const float*, int64_t, int, int)>;
using TpBackward = std::function<void(Device&, const collectives::ProcessGroup&, float*, float*, float*,
                                      const float*, const float*, const float*, int64_t, int, int)>;

struct TpLinear {
  TpForward column_forward;
  TpBackward column_backward;
  TpForward row_forward;
  TpBackward row_backward;
};

// Grades `fns`; prints the report (or appends it to *out); 0 when it passes, else 1.
int grade_tp_linear(const TpLinear& fns, std::string* out = nullptr);

}  // namespace shardlab::labs
