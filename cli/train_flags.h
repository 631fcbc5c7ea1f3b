// The flags `train`, `verify` and `sweep` share: model, batch, optimizer,
// data, hardware (`generate` and `serve` use their model-shape, parallel and
// hardware ones). Parsed into TrainOptions and ClusterOptions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"

namespace shardlab::cli {

struct TrainFlags {
  CommonFlags common;
  // Every flag that sets a field of the library's options binds to it here
  // (--steps, --lr, --tp, --zero, --micro-batches, --init, --phantom, ...:
  // the tables in train_flags.cc); options() fills in the rest and validates.
  train::TrainOptions opts;
  // The model: the preset --model, the shape flags over it (0: the preset's).
  std::string model = "tiny";
  int layers = 0, heads = 0, embd = 0, vocab = 0, seq = 0, batch = 0;
  std::optional<int> ffn;                  // --ffn / --ffn-hidden-size; unset: 4 x embd
  std::optional<int> vocab_divisible_by;  // --make-vocab-size-divisible-by; unset: the preset's rule
  // Unset: the preset's (GPTConfig's defaults for the dense presets: 0, 2, 1).
  std::optional<int> experts, top_k, moe_every;
  // The architecture over the preset's: --family, --kv-heads, --rope-theta,
  // --norm-eps, --tie-embeddings / --no-tie-embeddings (unset: the preset's).
  std::string family;
  std::optional<int> kv_heads;
  std::optional<int> head_dim;
  bool qk_norm = false;
  std::optional<int> kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim;  // MLA (unset: the preset's)
  std::optional<double> rope_theta, norm_eps;
  bool tie_embeddings = false, no_tie_embeddings = false;
  double aux_coef = -1;  // <0: the preset's with experts (GPTConfig's 0.01 unless an MoE preset says otherwise)
  double capacity_factor = 0;
  // Modern MoE (GPTConfig's n_moe_ffn, n_shared_expert, router, moe_norm_topk, moe_first_dense).
  // Unset / empty: the preset's.
  std::optional<int> moe_ffn, shared_experts, moe_first_dense, moe_groups, moe_group_top_k;
  std::string router;
  bool moe_norm_topk = true;
  // GPTConfig::router_bias_rate (training's; inference refuses it). Unset: the
  // preset's (deepseek-v3: 0.001), 0 where the experts cannot take it.
  std::optional<double> router_bias_rate;
  double dropout = 0;
  // Names the library parses into its enums (parse_schedule, ...).
  std::string lr_schedule = "constant", sampling = "random", cp_comm = "ring", moe_dispatcher = "alltoall", schedule = "1f1b";
  std::string recompute = "none", recompute_modules, recompute_method, phantom_routing = "uniform", attention = "auto",
      fusions;
  std::string attention_kernel;  // --attention-kernel: a profile's named kernel (select_attention_kernel); "": its default
  std::string arithmetic = "native";  // native or portable (model/arithmetic.h)
  std::string pp_layers;
  // Negated library fields: TrainOptions::parallel.overlap, .grad_accum_fusion and TrainOptions::fold.
  bool no_overlap = false, no_fold = false, no_grad_accum_fusion = false;
  std::optional<int> checkpoint_every;  // unset: a checkpoint after the last step only
  // The cluster's (cluster_options) and the tool's own outputs.
  std::string report, memory, precision = "fp32";
  std::string kv_cache_dtype = "auto";  // generate and serve (infer_flags.h)
  std::vector<std::string> faults;  // --fault SPEC or @FILE.json, repeatable (runtime/fault.h)

  void add(CLI::App* sub);
  // --checkpoint-dir, --checkpoint-every, --resume (train, not verify or sweep).
  void add_checkpoint_flags(CLI::App* sub);
  // Throws ConfigError for anything out of range.
  train::TrainOptions options() const;
  // The shape flags over the preset: sizes, --ffn, the MoE fields, and the
  // vocabulary padding (which needs --tp).
  model::GPTConfig model_config() const;
  void set_modern_moe(model::GPTConfig& c) const;
  void apply_family_flags(model::GPTConfig& c) const;  // --family ... --no-tie-embeddings
  ClusterOptions cluster_options() const;
  // The hardware profile of --profile and --nodes (apply_common) with
  // --attention-kernel's rates selected (select_attention_kernel).
  HardwareProfile profile() const;
};

// The model shape flags (--model, --layers ... --dropout); generate and serve
// share them with train.
FlagTable<TrainFlags> model_flags();

}  // namespace shardlab::cli
