// Lab 2's checks (grader.cc) on any ring all-reduce: the C++ exercise's
// (grader_main.cc, `make lab-2`) or a notebook's Python function
// (python/lab_graders.cc). One grader, so both are held to the same numbers.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "collectives/group.h"
#include "runtime/device.h"

namespace shardlab::labs {

// ring_all_reduce's signature (ring_allreduce.h).
using RingAllReduce = std::function<void(Device&, const collectives::ProcessGroup&, std::span<float>)>;

// Grades `fn`; prints the report (or appends it to *out); 0 when it passes, else 1.
int grade_ring_all_reduce(const RingAllReduce& fn, std::string* out = nullptr);

}  // namespace shardlab::labs
