#include "model/arithmetic.h"

#include "runtime/fiber.h"

namespace shardlab::model {

namespace {
thread_local Arithmetic t_arithmetic = Arithmetic::kNative;
// Each device fiber keeps its own (runtime/fiber.h).
[[maybe_unused]] const bool kept_per_fiber = keep_per_fiber({[]() -> void* { return &t_arithmetic; }, sizeof(t_arithmetic)});
thread_local bool t_split_sums = false;
[[maybe_unused]] const bool split_kept_per_fiber =
    keep_per_fiber({[]() -> void* { return &t_split_sums; }, sizeof(t_split_sums)});
}  // namespace

const char* arithmetic_name(Arithmetic a) { return a == Arithmetic::kPortable ? "portable" : "native"; }

std::optional<Arithmetic> parse_arithmetic(std::string_view name) {
  if (name == "native") return Arithmetic::kNative;
  if (name == "portable") return Arithmetic::kPortable;
  return std::nullopt;
}

Arithmetic arithmetic() { return t_arithmetic; }

ArithmeticScope::ArithmeticScope(Arithmetic a) : previous_(t_arithmetic) { t_arithmetic = a; }
ArithmeticScope::~ArithmeticScope() { t_arithmetic = previous_; }

bool split_sums() { return t_split_sums; }
SplitSumsScope::SplitSumsScope(bool on) : previous_(t_split_sums) { t_split_sums = on; }
SplitSumsScope::~SplitSumsScope() { t_split_sums = previous_; }

}  // namespace shardlab::model
