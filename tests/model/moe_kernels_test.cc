// MoE kernels: routing semantics by hand (ties, renormalised gates, aux loss,
// capacity drops, plan order) and finite-difference checks in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include <random>

#include "gradcheck.h"
#include "model/gpt.h"
#include "model/kernels.h"
#include "model/sink.h"
#include "runtime/profile.h"

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

Routed route(const std::vector<double>& logits, int N, int E, int K, double cap, RouterSpec spec = {},
             const std::vector<double>* bias = nullptr) {
  Routed r;
  r.probs.resize(N * E);
  r.gates.resize(N * K);
  r.frac.resize(E);
  r.expert.resize(N * K);
  r.slot.resize(N * K);
  r.aux = router_forward(r.probs.data(), r.expert.data(), r.slot.data(), r.gates.data(),
                         r.frac.data(), logits.data(), bias ? bias->data() : nullptr, N, E, K, cap, spec);
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

TEST(Router, SigmoidScoresNormalizedGatesAndAuxByHand) {
  // One token, E = 3, K = 2, logits {0, ln 3, −ln 3}: s = {1/2, 3/4, 1/4}.
  const std::vector<double> logits = {0.0, std::log(3.0), -std::log(3.0)};
  const Routed r = route(logits, 1, 3, 2, 0, {Router::kSigmoid, true});
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 0}));
  EXPECT_NEAR(r.probs[0], 0.5, 1e-15);
  EXPECT_NEAR(r.probs[1], 0.75, 1e-15);
  EXPECT_NEAR(r.probs[2], 0.25, 1e-15);
  EXPECT_NEAR(r.gates[0], 0.75 / 1.25, 1e-15);  // 0.6
  EXPECT_NEAR(r.gates[1], 0.5 / 1.25, 1e-15);   // 0.4
  // f = {1/2, 1/2, 0}; s' = s / 1.5 = {1/3, 1/2, 1/6}; aux = 3·(1/2·1/3 + 1/2·1/2) = 1.25
  EXPECT_NEAR(r.aux, 1.25, 1e-15);
  // Unnormalized: the gates are the raw scores.
  const Routed raw = route(logits, 1, 3, 2, 0, {Router::kSigmoid, false});
  EXPECT_NEAR(raw.gates[0], 0.75, 1e-15);
  EXPECT_NEAR(raw.gates[1], 0.5, 1e-15);
}

TEST(Router, SoftmaxWithoutNormKeepsTheProbabilities) {
  // logits {0, ln 2, ln 5}: p = {1/8, 2/8, 5/8}; top-2 = {2, 1} with gates {5/8, 2/8}.
  const std::vector<double> logits = {0.0, std::log(2.0), std::log(5.0)};
  const Routed r = route(logits, 1, 3, 2, 0, {Router::kSoftmax, false});
  EXPECT_EQ(r.expert, (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(r.gates[0], 0.625, 1e-15);
  EXPECT_NEAR(r.gates[1], 0.25, 1e-15);
  // Normalized (Mixtral's softmax over the top-2 logits): 5/7 and 2/7.
  const Routed n = route(logits, 1, 3, 2, 0, {Router::kSoftmax, true});
  EXPECT_NEAR(n.gates[0], 5.0 / 7, 1e-15);
  EXPECT_NEAR(n.gates[1], 2.0 / 7, 1e-15);
}

TEST(Router, SelectionBiasChoosesButDoesNotWeigh) {
  // s = {1/2, 3/4, 1/4} as above; bias {0, 0, +0.6} lifts expert 2's key to
  // 0.85 above expert 0's 0.5: top-2 = {2, 1}, gates from the unbiased
  // scores: 0.25 / 1.0 and 0.75 / 1.0.
  const std::vector<double> logits = {0.0, std::log(3.0), -std::log(3.0)}, bias = {0.0, 0.0, 0.6};
  const Routed r = route(logits, 1, 3, 2, 0, {Router::kSigmoid, true}, &bias);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(r.gates[0], 0.25, 1e-15);
  EXPECT_NEAR(r.gates[1], 0.75, 1e-15);
}

TEST(Router, Top8OfSixtyFourPicksTheEightLargestInOrder) {
  // Logit of expert e: (e·37 mod 64) / 8, all distinct; the top 8 are the
  // experts whose residues are 63, 62, ..., 56: e = 37⁻¹·r mod 64 (37·45 ≡ 1).
  const int E = 64, K = 8;
  std::vector<double> logits(E);
  for (int e = 0; e < E; ++e) logits[e] = (e * 37 % 64) / 8.0;
  const Routed r = route(logits, 1, E, K, 0);
  for (int k = 0; k < K; ++k) EXPECT_EQ(r.expert[k], (63 - k) * 45 % 64) << "k " << k;
  double sum = 0;
  for (double g : r.gates) sum += g;
  EXPECT_NEAR(sum, 1.0, 1e-14);
}

TEST(Router, GroupLimitedRoutingPicksFromTheBestGroupsOnly) {
  // E = 8 in 4 groups of 2 ({0,1} {2,3} {4,5} {6,7}); each token keeps the
  // group_top_k = 2 groups of largest key, a group's key the sum of its
  // K / 2 best scores (softmax probabilities; the sums below are given in
  // logits where they order the groups as the probabilities' sums do).
  const std::vector<double> logits = {5.0, 0.0, 4.6, 0.0, 4.55, 4.55, 4.5, 0.0};
  // Plain top-2: 0 (5), 2 (4.6).
  EXPECT_EQ(route(logits, 1, 8, 2, 0).expert, (std::vector<int32_t>{0, 2}));
  // Group keys (best one of each, K/group_top_k = 1): 5, 4.6, 4.55, 4.5 ->
  // groups 0 and 1: the same pair.
  RouterSpec groups;
  groups.groups = 4, groups.group_top_k = 2;
  EXPECT_EQ(route(logits, 1, 8, 2, 0, groups).expert, (std::vector<int32_t>{0, 2}));
  // K = 4, group_top_k = 2: a group's key sums its 2 best: 5, 4.6, 9.1, 4.5
  // -> groups 2 and 0 -> experts {4, 5, 0, 1} by key: 0 (5), 4, 5 (4.55 each,
  // lower index first), 1 (0); the plain top-4 is 0, 2, 4, 5.
  EXPECT_EQ(route(logits, 1, 8, 4, 0).expert, (std::vector<int32_t>{0, 2, 4, 5}));
  const Routed r = route(logits, 1, 8, 4, 0, groups);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 4, 5, 1}));
  // The gates renormalise over the chosen four (softmax scores).
  double z = 0;
  for (double l : logits) z += std::exp(l);
  const double chosen = std::exp(5.0) + 2 * std::exp(4.55) + std::exp(0.0);
  EXPECT_NEAR(r.gates[0], std::exp(5.0) / chosen, 1e-14);
  EXPECT_NEAR(r.probs[0], std::exp(5.0) / z, 1e-14);
  // The selection bias counts in the group keys too: +1 on expert 6's score
  // (the scores are probabilities, below 0.3 here) makes group 3's key the
  // largest -> groups 3 and 2 -> 6, then 4, 5 (tied), then 7.
  const std::vector<double> bias = {0, 0, 0, 0, 0, 0, 1.0, 0};
  EXPECT_EQ(route(logits, 1, 8, 4, 0, groups, &bias).expert, (std::vector<int32_t>{6, 4, 5, 7}));
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

// K up to 8 of E = 12 (fine-grained routing); a selection bias moves the
// choice but is not differentiated (it is not in the gates).
void check_router(double capacity_factor, const char* what, RouterSpec spec = {}, int K = 2,
                  bool with_bias = false) {
  std::mt19937_64 rng(11);
  const int N = 7, E = K > 2 ? 12 : 5;
  auto logits = random_vector(rng, N * E, 1.5), wg = random_vector(rng, N * K);
  const std::vector<double> bias = random_vector(rng, E, 0.3);
  const std::vector<double>* b = with_bias ? &bias : nullptr;
  const double c_aux = 0.8;
  auto loss = [&] {
    const Routed r = route(logits, N, E, K, capacity_factor, spec, b);
    return dot(r.gates, wg) + c_aux * r.aux;
  };
  const Routed r = route(logits, N, E, K, capacity_factor, spec, b);
  Accum dlogits(rng, N * E);
  router_backward(dlogits.data(), wg.data(), c_aux, r.probs.data(), r.expert.data(), r.frac.data(),
                  N, E, K, spec);
  auto g = dlogits.delta();
  check_gradients(what, {{"dlogits", &logits, &g}}, loss, kKernelTol);
}

TEST(KernelGradcheck, Router) { check_router(0, "router"); }
TEST(KernelGradcheck, RouterWithCapacity) { check_router(0.6, "router (capacity 0.6)"); }
TEST(KernelGradcheck, RouterSoftmaxUnnormalizedTop8) {
  check_router(0, "router softmax no-norm top-8", {Router::kSoftmax, false}, 8);
}
TEST(KernelGradcheck, RouterSigmoidNormalizedTop8) {
  check_router(0, "router sigmoid norm top-8", {Router::kSigmoid, true}, 8);
}
TEST(KernelGradcheck, RouterSigmoidUnnormalized) {
  check_router(0.6, "router sigmoid no-norm (cap)", {Router::kSigmoid, false});
}
TEST(KernelGradcheck, RouterSigmoidWithSelectionBias) {
  check_router(0, "router sigmoid norm, bias", {Router::kSigmoid, true}, 4, true);
}

// Aux-loss-free balancing by hand: N = 4 tokens, E = 4, K = 2 choose
// {0,1} {0,1} {0,2} {0,3}: loads (4, 2, 1, 1), mean N·K/E = 2, so the signal
// E·load − N·K = (8, 0, −4, −4) and the bias moves by rate · sign(mean − load)
// = (−r, 0, +r, +r). Two batches (micro-batches or replicas) add their
// signals: the second routes {1,2} {1,2} {2,3} {3,0}, loads (1, 2, 3, 2):
// (−4, 0, 4, 0); together (4, 0, 0, −4): only experts 0 and 3 move.
TEST(RouterBias, LoadSignalAndSignUpdateByHand) {
  std::vector<float> signal(4, 0.0f), bias{0.5f, 0.5f, 0.5f, 0.5f};
  const std::vector<int32_t> first{0, 1, 0, 1, 0, 2, 0, 3}, second{1, 2, 1, 2, 2, 3, 3, 0};
  router_bias_load(signal.data(), first.data(), 4, 4, 2);
  EXPECT_EQ(signal, (std::vector<float>{8, 0, -4, -4}));
  std::vector<float> one = bias;
  router_bias_update(one.data(), signal.data(), 4, 0.25);
  EXPECT_EQ(one, (std::vector<float>{0.25f, 0.5f, 0.75f, 0.75f}));
  router_bias_load(signal.data(), second.data(), 4, 4, 2);
  EXPECT_EQ(signal, (std::vector<float>{4, 0, 0, -4}));
  router_bias_update(bias.data(), signal.data(), 4, 0.25);
  EXPECT_EQ(bias, (std::vector<float>{0.25f, 0.5f, 0.5f, 0.75f}));
}

// The bias steers the choice, not the gates: scores (0.5, 0.3, 0.2) pick
// expert 0 at K = 1; a bias of +0.4 on expert 2 picks it instead, and its
// gate is its own score 0.2 (no renormalisation at K = 1 without norm_topk).
TEST(RouterBias, SelectsButDoesNotWeigh) {
  const std::vector<double> logits{std::log(0.5), std::log(0.3), std::log(0.2)}, bias{0, 0, 0.4};
  const Routed plain = route(logits, 1, 3, 1, 0, {Router::kSoftmax, false});
  const Routed biased = route(logits, 1, 3, 1, 0, {Router::kSoftmax, false}, &bias);
  EXPECT_EQ(plain.expert[0], 0);
  EXPECT_EQ(biased.expert[0], 2);
  EXPECT_NEAR(biased.gates[0], 0.2, 1e-12);
}

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

// The local experts' kernels are grouped (sink.h Exec::expert_of_group):
// per grouped kernel, the first expert with rows launches it, the later
// ones are charged without a launch, an expert without rows not at all.
struct Recorded {
  std::string name;
  bool launch;
};
struct RecordingSink final : OpSink {
  std::vector<Recorded> ops;
  void op(const char* name, const OpCost& cost) override { ops.push_back({name, cost.launch}); }
};

TEST(GroupedExperts, OneLaunchPerKernelAndNothingForAnExpertWithoutRows) {
  RecordingSink sink;
  const Exec ex = Exec::with(&sink);
  bool launched = false;
  const int64_t rows[] = {0, 5, 0, 3, 2};
  for (const int64_t r : rows) ex.expert_of_group(r, launched).op("mlp.c_fc.fwd", OpCost{1, 1});
  ASSERT_EQ(sink.ops.size(), 3u);  // the three experts with rows
  EXPECT_TRUE(sink.ops[0].launch);
  EXPECT_FALSE(sink.ops[1].launch);
  EXPECT_FALSE(sink.ops[2].launch);
  // Outside a group every op launches.
  ex.op("mlp.c_fc.fwd", OpCost{1, 1});
  EXPECT_TRUE(sink.ops.back().launch);
  // A member's duration is the kernel's less one launch.
  const HardwareProfile profile = load_profile("h100-nvlink");
  const CostModel cost(profile.device, Precision::kBf16);
  OpCost gemm{2.0 * 64 * 1024 * 512, (64.0 * 512 + 512.0 * 1024 + 64.0 * 1024) * 2, OpClass::kGemm, {64, 1024, 512}};
  OpCost member = gemm;
  member.launch = false;
  EXPECT_EQ(cost.duration(gemm) - cost.duration(member), cost.launch_overhead());
  EXPECT_EQ(cost.launch_overhead(), us_to_time(profile.device.launch_overhead_us));
}

// Through the model: one token routed to top_k = 2 of 8 experts in every
// MoE block runs each expert kernel twice, launched once, and never for the
// six experts without the token.
TEST(GroupedExperts, ADecodedTokenChargesOnlyItsExpertsWithOneLaunch) {
  GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 8, c.vocab_size = 64;
  c.n_expert = 8, c.top_k = 2;
  GPT<float> m(c, 3);
  RecordingSink sink;
  m.set_sink(&sink);
  const Token tok = 5;
  m.forward(&tok, nullptr, 1, 1);
  for (const char* name : {"mlp.c_fc.fwd", "mlp.c_proj.fwd", "mlp.gelu.fwd"}) {
    int charged = 0, launched = 0;
    for (const Recorded& r : sink.ops)
      if (r.name == name) charged += 1, launched += r.launch;
    std::printf("%s: %d charged, %d launched over %d MoE blocks\n", name, charged, launched, c.n_layer);
    EXPECT_EQ(charged, c.n_layer * c.top_k) << name;
    EXPECT_EQ(launched, c.n_layer) << name;
  }
}

}  // namespace
}  // namespace shardlab::model
