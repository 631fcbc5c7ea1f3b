// Megatron's selective recomputation by module (--recompute-modules): every
// module list gives the bits of no recomputation, keeps less, re-runs exactly
// the modules it names (their kernels once more, each as long as in the
// forward), and the memory it saves is the modules' activations, counted by
// hand from the shapes.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"
#include "runtime/profile.h"
#include "tests/model/parallel/expert/moe_test_util.h"
#include "tests/model/parallel/recompute_test_util.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using parallel::Recompute;
using testing::activation_peak;
using testing::expect_same_bits;

// A llama MoE of 4 blocks: block 0 dense, then MoE with a shared expert
// (DeepSeek's shape in small), 8 experts of width 96, top-2.
TrainOptions llama_moe(int tp, int dp, int ep) {
  TrainOptions o = testing::tiny_moe_options(dp, ep);
  o.model.family = model::Family::kLlama;
  o.model.n_kv_head = 2;
  o.model.n_moe_ffn = 96;
  o.model.n_shared_expert = 1;
  o.model.moe_first_dense = 1;
  o.model.aux_coef = 0.01;
  o.parallel.tp = tp;
  o.parallel.sp = tp > 1;
  return o;
}

TrainResult run(TrainOptions o, Recompute r, unsigned modules, bool trace = false) {
  o.parallel.recompute = r;
  o.parallel.recompute_modules = modules;
  validate_parallel(o);
  return testing::run(o, nullptr, trace);
}

// Each module alone and all of them: the bits of none, a smaller activation
// peak on every device, and the unsharded model's gradients (tol 1e-5).
void expect_modules_exact(const TrainOptions& o, const char* what) {
  const TrainResult none = run(o, Recompute::kNone, parallel::kRecomputeCoreAttn);
  TrainOptions ref = o;
  ref.parallel = {};
  const TrainResult unsharded = run(ref, Recompute::kNone, parallel::kRecomputeCoreAttn);
  const unsigned all = parallel::kRecomputeCoreAttn | parallel::kRecomputeLayerNorm | parallel::kRecomputeMoeAct |
                       parallel::kRecomputeSharedExperts | parallel::kRecomputeMlp;
  for (unsigned m : {unsigned(parallel::kRecomputeLayerNorm), unsigned(parallel::kRecomputeMlp),
                     unsigned(parallel::kRecomputeMoe), unsigned(parallel::kRecomputeMoeAct),
                     unsigned(parallel::kRecomputeSharedExperts), all,
                     unsigned(parallel::kRecomputeMoe | parallel::kRecomputeMlp)}) {
    const std::string name = std::string(what) + " " + parallel::recompute_modules_name(m);
    const TrainResult r = run(o, Recompute::kSelective, m);
    expect_same_bits(r, none, name);
    for (size_t rank = 0; rank < r.run.devices.size(); ++rank) {
      EXPECT_LT(activation_peak(r, rank), activation_peak(none, rank)) << name << " rank " << rank;
    }
    std::printf("%s: activation peak %llu of none's %llu bytes (device 0)\n", name.c_str(),
                (unsigned long long)activation_peak(r, 0), (unsigned long long)activation_peak(none, 0));
    testing::expect_like_unsharded(r, unsharded, o.model, name);
  }
}

TEST(RecomputeModules, TensorSequenceParallelMoeIsExact) {
  TrainOptions o = llama_moe(2, 1, 1);
  expect_modules_exact(o, "tp 2 sp, MoE split over TP");
}

TEST(RecomputeModules, ExpertParallelWithCapacityIsExact) {
  TrainOptions o = llama_moe(1, 2, 2);
  o.model.capacity_factor = 1.0;
  o.parallel.zero = 1;
  expect_modules_exact(o, "dp 2 ep 2 capacity 1.0");
}

TEST(RecomputeModules, WholeExpertsUnderTpAreExact) {
  TrainOptions o = llama_moe(2, 2, 4);
  o.parallel.expert_tp = 1;
  expect_modules_exact(o, "tp 2 sp dp 2 ep 4 expert-tp 1");
}

// DeepEP's dispatcher across nodes of 2: the MoE layer's re-run repeats the
// rail and node exchanges; the relay's kept rows stay.
TEST(RecomputeModules, DeepEpAcrossNodesIsExact) {
  TrainOptions o = llama_moe(1, 4, 4);
  o.parallel.moe_dispatcher = parallel::MoeDispatcher::kDeepEp;
  o.steps = 2;
  const TrainResult none = testing::run_moe(o, 2);
  for (unsigned m : {unsigned(parallel::kRecomputeMoe), unsigned(parallel::kRecomputeMoeAct),
                     unsigned(parallel::kRecomputeLayerNorm | parallel::kRecomputeSharedExperts)}) {
    o.parallel.recompute = Recompute::kSelective;
    o.parallel.recompute_modules = m;
    const TrainResult r = testing::run_moe(o, 2);
    const std::string name = "deepep " + parallel::recompute_modules_name(m);
    expect_same_bits(r, none, name);
    for (size_t rank = 0; rank < r.run.devices.size(); ++rank)
      EXPECT_LT(activation_peak(r, rank), activation_peak(none, rank)) << name << " rank " << rank;
    std::printf("%s: activation peak %llu of none's %llu bytes (device 0)\n", name.c_str(),
                (unsigned long long)activation_peak(r, 0), (unsigned long long)activation_peak(none, 0));
  }
}

TEST(RecomputeModules, PipelineOfGptBlocksIsExact) {
  TrainOptions o = testing::small_options(4);
  o.model.moe_every = 2;  // blocks 0 and 2 MoE, 1 and 3 dense (GELU, biases)
  o.model.n_shared_expert = 1;
  o.parallel.pp = 2;
  o.micro_batches = 4;
  o.keep_step0_grads = true;
  expect_modules_exact(o, "pp 2 1f1b M 4 gpt");
}

// Which kernels run again: per block and micro-batch, the named modules'
// kernels once more, each as long as its forward run (the same kernel on the
// same shapes), and no other module's.
TEST(RecomputeModules, ExactlyTheNamedModulesRunAgainAsLongAsInTheForward) {
  TrainOptions o = llama_moe(2, 1, 1);
  o.steps = 1;
  const int L = o.model.n_layer, moe = o.model.moe_layers(), dense = L - moe;
  ASSERT_EQ(dense, 1);
  struct Want {
    unsigned modules;
    std::map<std::string, int> counts;  // kernel (without ".recompute") -> re-runs on device 0
  };
  const std::vector<Want> wants = {
      {parallel::kRecomputeCoreAttn, {{"attn.flash.fwd", L}, {"mlp.c_fc.fwd", 0}, {"ln_2.fwd", 0}}},
      {parallel::kRecomputeMlp, {{"mlp.c_fc.fwd", dense}, {"mlp.swiglu.fwd", dense}, {"mlp.c_proj.fwd", dense},
                                 {"attn.flash.fwd", 0}, {"moe.router.fwd", 0}}},
      {parallel::kRecomputeLayerNorm, {{"ln_2.fwd", moe}, {"ln_1.fwd", 0}, {"mlp.c_fc.fwd", 0}}},
      // each expert's activation over its rows (8 experts on each rank, split over TP)
      {parallel::kRecomputeMoeAct, {{"mlp.swiglu.fwd", moe * o.model.n_expert}, {"mlp.c_fc.fwd", 0}, {"ln_2.fwd", 0}}},
      // the shared expert: one c_fc and one SwiGLU per MoE block
      {parallel::kRecomputeSharedExperts, {{"mlp.c_fc.fwd", moe}, {"mlp.swiglu.fwd", moe}, {"moe.router.fwd", 0}}},
      // the whole layer: the router and the shared expert with the 8 experts (2 a rank's TP share each)
      {parallel::kRecomputeMoe, {{"moe.router.fwd", moe}, {"ln_2.fwd", 0}, {"attn.flash.fwd", 0}}},
  };
  for (const Want& w : wants) {
    const TrainResult t = run(o, Recompute::kSelective, w.modules, true);
    std::map<std::string, int> again;
    std::map<std::string, std::vector<Time>> fwd, rec;
    for (const TraceEvent& e : t.run.traces[0].events) {
      std::string name = e.name;
      const std::string suffix = ".recompute";
      if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        name.resize(name.size() - suffix.size());
        ++again[name];
        rec[name].push_back(e.end - e.start);
      } else {
        fwd[name].push_back(e.end - e.start);
      }
    }
    const std::string what = parallel::recompute_modules_name(w.modules);
    for (const auto& [kernel, n] : w.counts) {
      EXPECT_EQ(again[kernel], n) << what << ": " << kernel;
      // Every re-run lasts as long as some forward run of the same kernel.
      for (Time d : rec[kernel]) {
        bool seen = false;
        for (Time f : fwd[kernel]) seen |= f == d;
        EXPECT_TRUE(seen) << what << ": " << kernel << " re-run for " << d << " ps, no forward run that long";
      }
    }
    std::printf("%s: %zu kernels re-run on device 0\n", what.c_str(), [&] {
      size_t n = 0;
      for (const auto& [k, c] : again) n += size_t(c);
      return n;
    }());
  }
}

// The memory: one block's saved activations less the modules', by hand.
// Two identical dense blocks (or two MoE ones), one device, one micro-batch,
// a vocabulary of 1,024 (the head's logits, probabilities and their gradient,
// 3 x (N, V), outweigh any block's re-run activations): the activation peak
// falls at the head's backward, where both blocks' kept activations are
// resident, so it falls by 2 x (the module's elements) x 4 B (fp32 real math).
TEST(RecomputeModules, TheSavedBytesAreTheModulesActivationsByHand) {
  TrainOptions o = testing::small_options(0);
  o.model.family = model::Family::kLlama;
  o.model.n_layer = 2;
  o.model.vocab_size = 1024;
  o.model.n_ffn = 96;
  o.steps = 1;
  const int64_t N = int64_t{o.model.batch_size} * o.model.block_size, F = 96;
  const uint64_t none = activation_peak(run(o, Recompute::kNone, parallel::kRecomputeCoreAttn), 0);
  const uint64_t mlp = activation_peak(run(o, Recompute::kSelective, parallel::kRecomputeMlp), 0);
  // the dense MLP keeps [gate | up] (N, 2F) and silu(gate)·up (N, F)
  const uint64_t mlp_by_hand = uint64_t(2 * (N * 2 * F + N * F) * 4);
  std::printf("dense mlp: %llu bytes saved, by hand %llu\n", (unsigned long long)(none - mlp),
              (unsigned long long)mlp_by_hand);
  EXPECT_EQ(none - mlp, mlp_by_hand);

  TrainOptions m = o;
  m.model.n_expert = 4;
  m.model.top_k = 2;
  m.model.n_moe_ffn = 48;
  m.model.n_shared_expert = 1;
  const int64_t C = m.model.n_embd, Fe = 48, K = 2;
  const uint64_t moe_none = activation_peak(run(m, Recompute::kNone, parallel::kRecomputeCoreAttn), 0);
  const uint64_t act = activation_peak(run(m, Recompute::kSelective, parallel::kRecomputeMoeAct), 0);
  const uint64_t norm = activation_peak(run(m, Recompute::kSelective, parallel::kRecomputeLayerNorm), 0);
  const uint64_t shared = activation_peak(run(m, Recompute::kSelective, parallel::kRecomputeSharedExperts), 0);
  // No capacity limit: the experts run N·K rows; their activation output (N·K, Fe);
  // ln_2's output (N, C); the shared expert's [gate | up] (N, 2Fe) and its output (N, Fe).
  const uint64_t act_by_hand = uint64_t(2 * N * K * Fe * 4), norm_by_hand = uint64_t(2 * N * C * 4),
                 shared_by_hand = uint64_t(2 * (N * 2 * Fe + N * Fe) * 4);
  std::printf("moe_act: %llu bytes saved, by hand %llu; layernorm %llu, %llu; shared_experts %llu, %llu\n",
              (unsigned long long)(moe_none - act), (unsigned long long)act_by_hand,
              (unsigned long long)(moe_none - norm), (unsigned long long)norm_by_hand,
              (unsigned long long)(moe_none - shared), (unsigned long long)shared_by_hand);
  EXPECT_EQ(moe_none - act, act_by_hand);
  EXPECT_EQ(moe_none - norm, norm_by_hand);
  EXPECT_EQ(moe_none - shared, shared_by_hand);
}

TEST(RecomputeModules, RefusesWhatDoesNotApply) {
  const auto refused = [](TrainOptions o, Recompute r, unsigned m, const char* needle) {
    o.parallel.recompute = r;
    o.parallel.recompute_modules = m;
    try {
      validate_parallel(o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const TrainOptions dense = testing::small_options(0);
  refused(dense, Recompute::kFull, parallel::kRecomputeMlp, "needs `recompute` selective (got full)");
  refused(dense, Recompute::kNone, parallel::kRecomputeMlp, "needs `recompute` selective (got none)");
  refused(dense, Recompute::kSelective, parallel::kRecomputeMoeAct, "moe_act re-runs part of an MoE layer");
  refused(testing::small_options(4), Recompute::kSelective, parallel::kRecomputeSharedExperts,
          "no shared expert");
  refused(testing::small_options(4), Recompute::kSelective, parallel::kRecomputeMlp, "every block of this model is MoE");
  refused(dense, Recompute::kSelective, parallel::kRecomputeMlaUpProj, "attention is not MLA");
  EXPECT_EQ(parallel::parse_recompute_modules("core_attn,mla_up_proj"),
            unsigned(parallel::kRecomputeCoreAttn | parallel::kRecomputeMlaUpProj));
  EXPECT_THROW(parallel::parse_recompute_modules("core_attn,mla"), ConfigError);
  EXPECT_THROW(parallel::parse_recompute_modules("mlp,mlp"), ConfigError);
  EXPECT_THROW(parallel::parse_recompute_modules("mlp,"), ConfigError);
  EXPECT_EQ(parallel::parse_recompute_modules("moe_act,layernorm"),
            unsigned(parallel::kRecomputeMoeAct | parallel::kRecomputeLayerNorm));
  EXPECT_EQ(parallel::parse_recompute_modules("moe_act+layernorm,mlp"),
            unsigned(parallel::kRecomputeMoeAct | parallel::kRecomputeLayerNorm | parallel::kRecomputeMlp));
  EXPECT_THROW(parallel::parse_recompute_modules("mlp++moe"), ConfigError);
  EXPECT_EQ(parallel::recompute_modules_name(parallel::kRecomputeMoeAct | parallel::kRecomputeLayerNorm),
            "layernorm,moe_act");
}

}  // namespace
}  // namespace shardlab::train
