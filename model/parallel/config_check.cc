#include "model/parallel/config_check.h"

#include <string>

#include "model/parallel/pipeline/stage.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

void check_tensor_parallel(const model::GPTConfig& cfg, int tp, bool sp, bool experts_whole) {
  auto fail = [&](const std::string& what) {
    throw ConfigError("`tp` " + std::to_string(tp) + ": " + what);
  };
  if (tp < 1) fail("must be at least 1");
  if (sp && tp < 2) throw ConfigError("`sp` needs `tp` of 2 or more");
  if (cfg.n_head % tp != 0)
    fail("must divide `n_head` " + std::to_string(cfg.n_head) +
         " (attention heads are split over TP ranks)");
  if (cfg.vocab_size % tp != 0)
    fail("must divide `vocab_size` " + std::to_string(cfg.vocab_size) +
         " (the vocabulary is split over TP ranks; `make_vocab_size_divisible_by` N pads it)");
  if (cfg.ffn_hidden() % tp != 0)
    fail("must divide the MLP width " + std::string(cfg.n_ffn > 0 ? "`n_ffn` = " : "4 x `n_embd` = ") +
         std::to_string(cfg.ffn_hidden()) + " (the MLP width is split over TP ranks)");
  // Routed and shared experts are split like the MLP.
  if (cfg.is_moe() && !experts_whole && cfg.moe_ffn_hidden() % tp != 0)
    fail("must divide the expert width `n_moe_ffn` = " + std::to_string(cfg.moe_ffn_hidden()) +
         " (each expert's MLP is split over TP ranks)");
  if (sp && cfg.block_size % tp != 0)
    fail("must divide `block_size` " + std::to_string(cfg.block_size) +
         " with `sp` (sequences are split over TP ranks)");
}

void check_expert_parallel(const model::GPTConfig& config, int ep, int dp) {
  auto fail = [&](const std::string& what) {
    throw ConfigError("`ep` " + std::to_string(ep) + " " + what);
  };
  if (ep < 1) fail("must be at least 1");
  if (ep == 1) return;
  if (!config.is_moe()) fail("needs an MoE model (`n_expert` > 0)");
  if (config.n_expert % ep != 0)
    fail("must divide `n_expert` " + std::to_string(config.n_expert) +
         " (each rank holds experts/ep experts)");
  if (dp % ep != 0)
    fail("must divide `dp` " + std::to_string(dp) +
         " (expert-parallel ranks are data-parallel ranks)");
}

void check_expert_tensor_parallel(const model::GPTConfig& config, const ParallelShape& s) {
  const auto fail = [&](const std::string& what) {
    throw ConfigError("`expert_tp` " + std::to_string(s.expert_tp) + " " + what);
  };
  if (s.expert_tp != 0 && s.expert_tp != 1 && s.expert_tp != s.tp)
    fail("must be 1 (whole experts) or `tp` " + std::to_string(s.tp) +
         " (experts split like the MLP)");
  if (!s.experts_whole()) return;
  if (!config.is_moe()) fail("is about MoE experts: it needs an MoE model (`n_expert` > 0)");
  if (!s.sp)
    fail(
        "with `tp` > 1 routes each rank's sequence-parallel rows: it needs `sp` (Megatron requires "
        "it with MoE and "
        "TP)");
  if (s.ep % s.tp != 0)
    fail("draws the expert-parallel group from tp x dp, tp ranks first: `ep` " +
         std::to_string(s.ep) + " must be a multiple of `tp` " + std::to_string(s.tp));
  if (config.n_expert % s.ep != 0)
    throw ConfigError("`ep` " + std::to_string(s.ep) + " must divide `n_expert` " +
                      std::to_string(config.n_expert) + " (each rank holds experts/ep experts)");
  if (int64_t{s.tp} * s.dp % s.ep != 0)
    throw ConfigError("`ep` " + std::to_string(s.ep) +
                      " must divide `tp` x `dp` = " + std::to_string(int64_t{s.tp} * s.dp) +
                      " with `expert_tp` 1 (the expert-parallel ranks are "
                      "tensor- and data-parallel ranks)");
}

void check_parallel_shape(const model::GPTConfig& config, const ParallelShape& s) {
  config.validate();
  check_tensor_parallel(config, s.tp, s.sp, s.experts_whole());
  check_expert_tensor_parallel(config, s);
  if (s.pp < 1) throw ConfigError("`pp` " + std::to_string(s.pp) + ": must be at least 1");
  if (s.vpp < 1) throw ConfigError("`vpp` " + std::to_string(s.vpp) + ": must be at least 1");
  check_stage_layers(config, s.pp, s.vpp, s.stage_layers);
  if (!s.experts_whole()) check_expert_parallel(config, s.ep, s.dp);
}

}  // namespace shardlab::parallel
