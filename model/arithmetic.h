// Which arithmetic the kernels of this thread use: the host's fastest GEMM,
// or one whose bits are the same on every machine.
//
// Every kernel but the GEMM is written so that its bits do not depend on the
// host: reductions run in a fixed number of lanes (model/portable_math.h),
// exp, tanh and log are the project's own (glibc picks its variant per CPU),
// and the build never fuses a multiply and an add on its own
// (-ffp-contract=off). The GEMM is the exception. Eigen's kernels use the
// vector units the build targets (FMA or not, 4, 8 or 16 lanes), so a GEMM's
// bits differ between an AVX-512 build, an AVX2 build and `make portable`.
//
//   kNative    Eigen's GEMM (the default: the fastest on this host). Results
//              are reproducible on one machine and one build, not across them.
//   kPortable  the project's own GEMM: one fixed summation order, no fused
//              multiply-add, plain IEEE-754 float. The same bits on every
//              x86-64 or ARM machine and every build (native, portable,
//              sanitizers), at a fraction of Eigen's speed. The pinned runs
//              (tests/model/train/pinned_runs_test.cc) use it; `--arithmetic
//              portable` gives it to a user who compares runs across machines.
//
// Thread safety: the setting is per thread (each virtual device is one
// thread); an ArithmeticScope sets it for the scope's lifetime.
#pragma once

#include <optional>
#include <string_view>

namespace shardlab::model {

enum class Arithmetic { kNative, kPortable };

const char* arithmetic_name(Arithmetic a);
std::optional<Arithmetic> parse_arithmetic(std::string_view name);

// The setting of the calling thread (kNative unless a scope says otherwise).
Arithmetic arithmetic();
inline bool portable_arithmetic() { return arithmetic() == Arithmetic::kPortable; }

// Sets the calling thread's arithmetic while it lives.
class ArithmeticScope {
 public:
  explicit ArithmeticScope(Arithmetic a);
  ~ArithmeticScope();
  ArithmeticScope(const ArithmeticScope&) = delete;
  ArithmeticScope& operator=(const ArithmeticScope&) = delete;

 private:
  Arithmetic previous_;
};

// Split sums: every GEMM of the calling thread sums its K in two halves and
// adds the second half's product to the first's, in the thread's
// arithmetic, as tensor parallelism splits a row-parallel GEMM's sum over
// its ranks (model/gemm.h). Off by default; verify's noise floor turns it on
// (model/train/verify.h): the reference's own rounding, perturbed the way a
// TP or CP run perturbs it, with the same bits on every machine under
// portable arithmetic.
bool split_sums();
class SplitSumsScope {
 public:
  explicit SplitSumsScope(bool on);
  ~SplitSumsScope();
  SplitSumsScope(const SplitSumsScope&) = delete;
  SplitSumsScope& operator=(const SplitSumsScope&) = delete;

 private:
  bool previous_;
};

}  // namespace shardlab::model
