// The flags `train`, `verify` and `sweep` share: model, batch, optimizer,
// data, hardware (`generate` and `serve` use their model-shape, parallel and
// hardware ones). Parsed into TrainOptions and ClusterOptions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/cli.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"

namespace shardlab::cli {

struct TrainFlags {
  CommonFlags common;
  std::string model = "tiny";
  int layers = 0, heads = 0, embd = 0, vocab = 0, seq = 0, batch = 0;  // 0: the preset's
  std::optional<int> ffn;                  // --ffn / --ffn-hidden-size; unset: 4 x embd
  std::optional<int> vocab_divisible_by;  // --make-vocab-size-divisible-by; unset: the preset's rule
  int experts = 0, top_k = 2, moe_every = 1;
  double aux_coef = -1;  // <0: 0.01 when experts > 0
  double capacity_factor = 0;
  double dropout = 0;
  int steps = 100;
  uint64_t seed = 1337;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
  int warmup_steps = 0;
  std::string lr_schedule = "constant";
  std::string data = "synthetic:markov";
  std::string sampling = "random";
  std::string init, save, report, memory, precision = "fp32";
  int dp = 1, tp = 1, zero = 0;
  int ep = 1, pp = 1, micro_batches = 1;
  int cp = 1;                    // context parallelism
  std::string cp_comm = "ring";  // ring or allgather
  std::optional<int> vpp;  // unset: the schedule's own chunk count (the library's default)
  std::string schedule = "1f1b", pp_layers, recompute = "none";
  bool sp = false, scatter_gather = false, no_overlap = false, phantom = false, no_fold = false;
  bool reshard_after_forward = true, prefetch = true;  // ZeRO-3
  int hsdp = 0;
  std::string phantom_routing = "uniform";
  std::string arithmetic = "native";  // native or portable (model/arithmetic.h)
  double bucket_mb = 25;
  std::string corrupt_shard;  // hidden: verify's can-it-fail test
  std::vector<std::string> faults;  // --fault SPEC or @FILE.json, repeatable (runtime/fault.h)
  std::string checkpoint_dir, resume;       // train only (add_checkpoint_flags)
  std::optional<int> checkpoint_every;      // unset: a checkpoint after the last step only

  void add(CLI::App* sub);
  // --checkpoint-dir, --checkpoint-every, --resume (train, not verify or sweep).
  void add_checkpoint_flags(CLI::App* sub);
  // Throws ConfigError for anything out of range.
  train::TrainOptions options() const;
  // The shape flags over the preset: sizes, --ffn, the MoE fields, and the
  // vocabulary padding (which needs --tp).
  model::GPTConfig model_config() const;
  ClusterOptions cluster_options() const;
};

// The model shape flags (--model, --layers ... --capacity-factor) into f;
// generate shares them with train.
void add_model_flags(CLI::App* sub, TrainFlags& f);

}  // namespace shardlab::cli
