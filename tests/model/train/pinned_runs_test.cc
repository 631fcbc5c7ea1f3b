// Regression pins: the losses and final parameters of a handful of configs,
// bit for bit, recorded before the parallel layers were restructured (issue
// "one home per parallelism"). A refactor of the sharded model, the executor
// or the device program must not change a single bit of these runs; a change
// that is meant to alter the math (a new reduction order, a new kernel) must
// say so and re-pin, explaining why in its commit.
//
// Pinned: every step's loss (as hex floats) and an FNV-1a hash of the bits of
// the final unsharded parameters. Virtual times are not pinned here (the cost
// of a kernel may legitimately change); tests elsewhere assert them exactly.
//
// Float bits depend on the machine's arithmetic too: the compiler, the vector
// units the build targets (-march=native vs `make portable`), sanitizer
// builds, Eigen's version. The pins hold for the arithmetic they were
// recorded with, identified by kKernelFingerprint (a hash of a few kernels on
// fixed data); on other arithmetic the test prints the values and skips.
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/buffer.h"
#include "model/config.h"
#include "model/kernels.h"
#include "model/optimizer.h"
#include "model/train/trainer.h"
#include "tests/model/train/train_test_util.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

using parallel::ScheduleKind;

uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    for (int i = 0; i < 4; ++i) {
      h ^= (bits >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

std::string fmt_hex(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%a", x);
  return buf;
}

// A hash of the kernels' arithmetic: GEMM, LayerNorm, GELU, attention and
// AdamW on fixed data (the pieces every pinned run is made of).
uint64_t kernel_fingerprint() {
  const int B = 2, T = 8, C = 32, NH = 4, OC = 48;
  using Buf = model::Buffer<float>;  // 64-byte aligned: Eigen's bits depend on alignment
  Buf x(size_t(B * T * C)), w(size_t(OC * C)), y(size_t(B * T * OC)), qkv(size_t(B * T * 3 * C));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11f * float(i)) * 0.1f;
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.05f * float(i) + 1.0f);
  Buf ln(x.size()), mean(size_t(B * T)), rstd(size_t(B * T)), gamma(size_t(C), 1.1f), beta(size_t(C), 0.1f),
      gelu(y.size()), att(size_t(B * NH * T * T)), out(x.size());
  model::linear_forward(y.data(), x.data(), w.data(), static_cast<const float*>(nullptr), B * T, C, OC);
  model::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), B * T, C);
  model::gelu_forward(gelu.data(), y.data(), int64_t(y.size()));
  model::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, C / NH);
  Buf p(w), m(w.size(), 0.0f), v(w.size(), 0.0f);
  model::adamw_update(p.data(), m.data(), v.data(), w.data(), int64_t(w.size()), model::AdamWHyper{}, 0.1, 1);
  uint64_t h = 0;
  for (const Buf* b : {&y, &p, &ln, &gelu, &out}) h = h * 31 + fnv1a(std::vector<float>(b->begin(), b->end()));
  return h;
}

struct Pin {
  const char* name;
  std::vector<double> losses;  // per step, exactly
  uint64_t params_hash;
};

TrainOptions config(const std::string& name) {
  if (name == "dense") return testing::small_options(0);
  if (name == "tp2_sp_dp2_zero1") {
    TrainOptions o = testing::small_options(0);
    o.parallel.tp = 2, o.parallel.sp = true, o.parallel.dp = 2, o.parallel.zero = 1;
    return o;
  }
  if (name == "tp2_dp2_zero2_moe") {
    TrainOptions o = testing::small_options(4);
    o.parallel.tp = 2, o.parallel.dp = 2, o.parallel.zero = 2;
    return o;
  }
  if (name == "pp2_1f1b_m4") {
    TrainOptions o = testing::small_options(0);
    o.parallel.pp = 2, o.micro_batches = 4;
    return o;
  }
  if (name == "pp2_interleaved_m4") {
    TrainOptions o = testing::small_options(0);
    o.parallel.pp = 2, o.micro_batches = 4, o.parallel.vpp = 2;
    o.parallel.schedule = ScheduleKind::kInterleaved;
    return o;
  }
  if (name == "dp4_ep4_moe") {
    TrainOptions o = testing::small_options(4);
    o.parallel.dp = 4, o.parallel.ep = 4;
    return o;
  }
  // 4D: tp 2 x pp 2 x dp 2 x ep 2, SP, capacity drops, ZeRO-1, 1F1B.
  TrainOptions o = testing::small_options(4);
  o.model.capacity_factor = 1.0;
  o.parallel.tp = 2, o.parallel.pp = 2, o.parallel.dp = 2, o.parallel.ep = 2;
  o.parallel.sp = true, o.parallel.zero = 1, o.micro_batches = 2;
  return o;
}

// The fingerprint of the arithmetic the pins below were recorded with
// (g++ 12, -O3 -march=native on this project's machines).
constexpr uint64_t kKernelFingerprint = 0x8beca308bb049965ull;

class PinnedRun : public ::testing::TestWithParam<Pin> {};

TEST_P(PinnedRun, LossesAndParametersAreBitIdenticalToThePin) {
  const Pin& pin = GetParam();
  const uint64_t arithmetic = kernel_fingerprint();
  std::printf("kernel fingerprint 0x%016llx (pins recorded with 0x%016llx)\n",
              static_cast<unsigned long long>(arithmetic), static_cast<unsigned long long>(kKernelFingerprint));
  const TrainResult r = testing::run(config(pin.name));
  ASSERT_EQ(r.steps.size(), pin.losses.size());
  std::string got;
  for (const StepRecord& s : r.steps) got += (got.empty() ? "" : ", ") + fmt_hex(s.loss);
  std::printf("virtual step time %.3f us\n", to_us(r.steps.back().virtual_end - r.steps[r.steps.size() - 2].virtual_end));
  std::printf("got: Pin{\"%s\", {%s}, 0x%016llxull}\n", pin.name, got.c_str(),
              static_cast<unsigned long long>(fnv1a(r.final_params)));
  if (arithmetic != kKernelFingerprint)
    GTEST_SKIP() << "this build's float arithmetic differs from the pins' (compiler, -march, sanitizers)";
  for (size_t i = 0; i < pin.losses.size(); ++i)
    EXPECT_EQ(r.steps[i].loss, pin.losses[i]) << "step " << i;
  EXPECT_EQ(fnv1a(r.final_params), pin.params_hash);
}

INSTANTIATE_TEST_SUITE_P(
    Pins, PinnedRun,
    ::testing::Values(
        Pin{"dense", {0x1.0bfb7cp+2, 0x1.02ce78p+2, 0x1.f9080ap+1}, 0x4af4b6eb037e7dc7ull},
        Pin{"tp2_sp_dp2_zero1", {0x1.0bfb7cp+2, 0x1.02ce78p+2, 0x1.f9080ap+1}, 0xe8c54570ccf303d7ull},
        Pin{"tp2_dp2_zero2_moe", {0x1.0ea5fp+2, 0x1.0569c8p+2, 0x1.fccc6ap+1}, 0xe3406df091631ec8ull},
        Pin{"pp2_1f1b_m4", {0x1.0bfb7cp+2, 0x1.02ce78p+2, 0x1.f9080ap+1}, 0xd25d3c9792606436ull},
        Pin{"pp2_interleaved_m4", {0x1.0bfb7cp+2, 0x1.02ce78p+2, 0x1.f9080ap+1}, 0xd25d3c9792606436ull},
        Pin{"dp4_ep4_moe", {0x1.0ea5fp+2, 0x1.0569c8p+2, 0x1.fccc68p+1}, 0x8487f8be6f126685ull},
        Pin{"tp2_pp2_dp2_ep2_4d", {0x1.0eab58p+2, 0x1.05e43cp+2, 0x1.fe015p+1}, 0xe5b39b9f274df4b7ull}),
    [](const ::testing::TestParamInfo<Pin>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace shardlab::train
