// The flags `generate` and `serve` share: train's model shape flags (the MoE
// routing's top-k is --moe-top-k, --top-k being sampling's; its scores are
// --moe-router, --router being serve's request routing), the split
// (--tp --pp --ep), --memory, --precision, --phantom and --init; and the
// checked load of --init.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/train_flags.h"
#include "model/io/safetensors.h"

namespace shardlab::cli {

struct InferenceFlagHelp {
  std::string ep;       // what --ep means for the command
  std::string memory;   // --memory's example
  std::string phantom;  // what --phantom does for the command
};

void add_inference_flags(CLI::App* sub, TrainFlags& m, const InferenceFlagHelp& help);

// Without --precision, a published preset (model::PresetInfo::published_params)
// is modeled in bf16, as it is served; the toy presets and custom shapes in
// fp32. Call in the command's action, after parsing.
void default_inference_precision(const CLI::App* sub, TrainFlags& m);

// --kv-cache-dtype: true for fp8, false for auto; ConfigError otherwise.
bool kv_cache_fp8(const TrainFlags& m);

// The --init checkpoint, checked against `config` (exactly its tensors and
// shapes; one error line naming --init); nothing without --init. --phantom
// takes no --init. A checkpoint of an MoE with aux-loss-free balancing's
// selection biases (mlp.gate.e_score_correction_bias) turns them on in
// `config`: they steer the routing (the rate, training's, is then the
// checkpoint's, or DeepSeek-V3's 0.001 for a file without shardlab's metadata).
std::optional<model::SafetensorsFile> load_inference_init(const TrainFlags& m, model::GPTConfig& config);

}  // namespace shardlab::cli
