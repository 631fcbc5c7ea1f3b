// Modern MoE (fine-grained top-8 experts, shared experts, each router) through
// the trainer: a sharded run against the unsharded model (losses per step,
// step-0 gradients, final parameters; verify's tolerance 1e-5 relative).
// Shared by moe_modern_verify_test.cc (one case per parallelism, make test)
// and moe_modern_full_test.cc (the matrix, ctest label `full`).
#pragma once

#include <cstdio>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train::testing {

// The four routers: scores x top-k gate normalization.
struct RouterCase {
  const char* name;
  model::Router score;
  bool norm_topk;
};
inline constexpr RouterCase kRouters[] = {{"softmax_norm", model::Router::kSoftmax, true},
                                          {"softmax_raw", model::Router::kSoftmax, false},
                                          {"sigmoid_norm", model::Router::kSigmoid, true},
                                          {"sigmoid_raw", model::Router::kSigmoid, false}};

struct ParallelCase {
  const char* name;
  int tp = 1, dp = 1, pp = 1, ep = 1, cp = 1, micro = 1, zero = 0;
  bool sp = false;
  int world() const { return tp * dp * pp * cp; }
};

struct ModernCase {
  ParallelCase par;
  RouterCase router;
  std::string name() const { return std::string(par.name) + "_" + router.name; }
};
inline void PrintTo(const ModernCase& c, std::ostream* os) { *os << c.name(); }

// small_options' 4 blocks of width 64 with 16 fine-grained experts of width
// 32 (the dense width is 256), top-8, and 2 shared experts (one MLP of 64);
// block 0 dense (DeepSeek-V3's first dense blocks).
inline TrainOptions modern_options(const ModernCase& c) {
  TrainOptions o = small_options(16);
  o.model.top_k = 8;
  o.model.n_moe_ffn = 32;
  o.model.n_shared_expert = 2;
  o.model.moe_first_dense = 1;
  o.model.router = c.router.score;
  o.model.moe_norm_topk = c.router.norm_topk;
  o.keep_step0_grads = true;
  const ParallelCase& p = c.par;
  o.parallel.tp = p.tp, o.parallel.sp = p.sp, o.parallel.dp = p.dp, o.parallel.pp = p.pp;
  o.parallel.ep = p.ep, o.parallel.cp = p.cp, o.parallel.zero = p.zero;
  o.micro_batches = p.micro;
  if (p.world() >= 32) {  // the 32-GPU case: fewer, smaller steps keep it fast
    o.model.n_layer = 2;
    o.steps = 2;
  }
  return o;
}

inline void expect_matches_unsharded(const ModernCase& c) {
  const TrainOptions o = modern_options(c);
  const TrainResult a = run(o), b = run(unsharded(o));
  const VerifyResult r = compare_runs(a, b, model::ParamTable(o.model), {.grads = true});
  std::printf("%s (%d devices, E16 top-8 width 32, shared 2): loss rel diff %.2e, param rel L2 %.2e, "
              "grad rel L2 %.2e (tol 1e-5)\n",
              c.name().c_str(), o.parallel.world(), r.max_loss_rel_diff, r.param_rel_l2, r.grad_rel_l2);
  EXPECT_TRUE(r.passed) << (r.first_mismatch ? r.first_mismatch->kind + " " + r.first_mismatch->name : "");
  EXPECT_LE(r.grad_rel_l2, 1e-5);
  EXPECT_TRUE(a.replica_mismatch.empty()) << a.replica_mismatch;
}

}  // namespace shardlab::train::testing
