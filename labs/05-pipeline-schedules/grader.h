// Lab 5's checks (grader.cc) on any two schedule builders: the C++
// exercise's (grader_main.cc, `make lab-5`) or a notebook's Python functions
// (python/lab_graders.cc). One grader: the same validator, bubble formula,
// activation counts and training run for both.
#pragma once

#include <functional>
#include <string>

#include "model/parallel/pipeline/schedule.h"

namespace shardlab::labs {

// (pp, micro_batches) -> the schedule (schedules.h).
using ScheduleFn = std::function<parallel::Schedule(int, int)>;

// Grades GPipe and 1F1B; prints the report (or appends it to *out); 0 when it passes, else 1.
int grade_schedules(const ScheduleFn& gpipe, const ScheduleFn& one_f_one_b, std::string* out = nullptr);

}  // namespace shardlab::labs
