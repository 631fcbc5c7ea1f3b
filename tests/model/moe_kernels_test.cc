// MoE kernels: routing semantics by hand (ties, renormalised gates, aux loss,
// capacity drops, plan order) and finite-difference checks in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gradcheck.h"
#include "model/kernels.h"

namespace shardlab::model {
namespace {

using testing::Accum;
using testing::check_gradients;
using testing::dot;
using testing::random_vector;

using testing::kKernelTol;

struct Routed {
  std::vector<double> probs, gates, frac;
  std::vector<int32_t> expert, slot;
  double aux = 0;
};

Routed route(const std::vector<double>& logits, int N, int E, int K, double cap) {
  Routed r;
  r.probs.resize(N * E);
  r.gates.resize(N * K);
  r.frac.resize(E);
  r.expert.resize(N * K);
  r.slot.resize(N * K);
  r.aux = router_forward(r.probs.data(), r.expert.data(), r.slot.data(), r.gates.data(),
                         r.frac.data(), logits.data(), N, E, K, cap);
  return r;
}

TEST(Router, TopKTiesGoToLowerIndexAndGatesRenormalise) {
  // token 0: experts 1 and 3 tie for first, 0 and 2 tie for third.
  // token 1: all equal -> experts 0, 1.
  const std::vector<double> logits = {0.0, 2.0, 0.0, 2.0, /**/ 1.0, 1.0, 1.0, 1.0};
  const Routed r = route(logits, 2, 4, 2, 0);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 3, 0, 1}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 0, 0, 1}));
  for (double g : r.gates) EXPECT_DOUBLE_EQ(g, 0.5);
  // f = {1, 2, 0, 1} / (N·K = 4); P = mean of probs; aux = E·Σ f·P
  const double e2 = std::exp(2.0);
  const double p_hi = e2 / (2 * e2 + 2), p_lo = 1 / (2 * e2 + 2);
  const double P[4] = {(p_lo + 0.25) / 2, (p_hi + 0.25) / 2, (p_lo + 0.25) / 2, (p_hi + 0.25) / 2};
  const double f[4] = {0.25, 0.5, 0.0, 0.25};
  double aux = 0;
  for (int i = 0; i < 4; ++i) aux += f[i] * P[i];
  EXPECT_NEAR(r.aux, 4 * aux, 1e-15);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(r.frac[i], f[i]);
}

TEST(Router, CapacityDropsLaterTokensInOrder) {
  // 5 tokens, E = 2, K = 1, F = 1: capacity ⌈1·5·1/2⌉ = 3; all prefer expert 0.
  EXPECT_EQ(expert_capacity(5, 2, 1, 1.0), 3);
  EXPECT_EQ(expert_capacity(5, 2, 1, 0.0), 5);
  const std::vector<double> logits = {1, 0, 2, 0, 3, 0, 4, 0, 0, 1};
  const Routed r = route(logits, 5, 2, 1, 1.0);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 0, 0, 0, 1}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 1, 2, -1, 0}));
  EXPECT_DOUBLE_EQ(r.frac[0], 0.8);  // counted before the drop
  std::vector<int64_t> src(5), offsets(3);
  const int64_t M = moe_plan(src.data(), offsets.data(), r.expert.data(), r.slot.data(), 5, 2, 1);
  EXPECT_EQ(M, 4);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(std::vector<int64_t>(src.begin(), src.begin() + 4), (std::vector<int64_t>{0, 1, 2, 4}));
}

void check_router(double capacity_factor, const char* what) {
  std::mt19937_64 rng(11);
  const int N = 7, E = 5, K = 2;
  auto logits = random_vector(rng, N * E, 1.5), wg = random_vector(rng, N * K);
  const double c_aux = 0.8;
  auto loss = [&] {
    const Routed r = route(logits, N, E, K, capacity_factor);
    return dot(r.gates, wg) + c_aux * r.aux;
  };
  const Routed r = route(logits, N, E, K, capacity_factor);
  Accum dlogits(rng, N * E);
  router_backward(dlogits.data(), wg.data(), c_aux, r.probs.data(), r.expert.data(), r.frac.data(),
                  N, E, K);
  auto g = dlogits.delta();
  check_gradients(what, {{"dlogits", &logits, &g}}, loss, kKernelTol);
}

TEST(KernelGradcheck, Router) { check_router(0, "router"); }
TEST(KernelGradcheck, RouterWithCapacity) { check_router(0.6, "router (capacity 0.6)"); }

TEST(KernelGradcheck, DispatchAndCombine) {
  std::mt19937_64 rng(12);
  const int N = 6, E = 3, K = 2, C = 4;
  const Routed r = route(random_vector(rng, N * E), N, E, K, 0.7);
  std::vector<int64_t> src(N * K), offsets(E + 1);
  const int64_t M = moe_plan(src.data(), offsets.data(), r.expert.data(), r.slot.data(), N, E, K);
  ASSERT_LT(M, N * K);  // something was dropped
  auto x = random_vector(rng, N * C), ye = random_vector(rng, M * C);
  auto gates = random_vector(rng, N * K), w_xe = random_vector(rng, M * C),
       w_out = random_vector(rng, N * C);
  auto loss = [&] {
    std::vector<double> xe(M * C), out(N * C);
    moe_dispatch_forward(xe.data(), x.data(), src.data(), M, K, C);
    moe_combine_forward(out.data(), ye.data(), gates.data(), src.data(), N, M, K, C);
    return dot(xe, w_xe) + dot(out, w_out);
  };
  Accum dx(rng, N * C), dye(rng, M * C), dgates(rng, N * K);
  moe_dispatch_backward(dx.data(), w_xe.data(), src.data(), M, K, C);
  moe_combine_backward(dye.data(), dgates.data(), w_out.data(), ye.data(), gates.data(), src.data(),
                       M, K, C);
  auto g1 = dx.delta(), g2 = dye.delta(), g3 = dgates.delta();
  check_gradients("dispatch+combine", {{"dx", &x, &g1}, {"dye", &ye, &g2}, {"dgates", &gates, &g3}},
                  loss, kKernelTol);
}

}  // namespace
}  // namespace shardlab::model
