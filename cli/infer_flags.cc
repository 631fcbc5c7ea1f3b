#include "cli/infer_flags.h"

#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "model/infer/generate.h"
#include "model/params.h"
#include "runtime/errors.h"

namespace shardlab::cli {
namespace {

#define FIELD(path) FLAG_FIELD(TrainFlags, path)

FlagTable<TrainFlags> inference_flags(const InferenceFlagHelp& help) {
  const CLI::Validator degree = number_in(1, double(kMaxDevices));
  return {
      {"--moe-top-k", FIELD(top_k), "MoE experts per token", number_in(1, 1 << 16), kShowDefault},
      {"--moe-router", FIELD(router),
       "MoE router scores: softmax (over the experts) or sigmoid (DeepSeek-V3) (default: the preset's, softmax)"},
      {"--init", FIELD(opts.init_path), "Weights from FILE.safetensors (strict: exactly the model's tensors)",
       nonempty()},
      {"--tp", FIELD(opts.parallel.tp), "Tensor-parallel degree", degree, kShowDefault},
      {"--pp", FIELD(opts.parallel.pp), "Pipeline stages", degree, kShowDefault},
      {"--ep", FIELD(opts.parallel.ep), help.ep, degree, kShowDefault},
      {"--memory", FIELD(memory), "Per-device memory, e.g. " + help.memory + " (default: the profile's)", nonempty()},
      {"--precision", FIELD(precision),
       "Modeled precision: fp32, bf16, or fp8 (an FP8 checkpoint as vLLM serves it: the linears' weights in FP8, "
       "each linear's input quantized per token, FP8 GEMMs; BF16 elsewhere and in the KV cache) (default: bf16 for "
       "the published presets, as they are served; fp32 otherwise)"},
      {"--kv-cache-dtype", FIELD(kv_cache_dtype),
       "The KV cache's element type: auto (the activations', --precision's) or fp8 (1 B, quantized as each token "
       "is appended and read at 1 B by the attention kernels, vLLM's --kv-cache-dtype fp8)",
       {}, kShowDefault},
      {"--phantom", FIELD(opts.phantom), help.phantom},
  };
}

#undef FIELD

}  // namespace

void add_inference_flags(CLI::App* sub, TrainFlags& m, const InferenceFlagHelp& help) {
  FlagTable<TrainFlags> table = model_flags();
  // --moe-top-k here (--top-k is sampling's); the global batch, the auxiliary
  // loss, dropout and the router bias's rate are training's: inference takes none of them.
  std::erase_if(table, [](const FlagRow<TrainFlags>& row) {
    if (row.names.starts_with("--moe-top-k") || row.names.starts_with("--moe-router")) return true;
    for (const char* name : {"--batch", "--aux-coef", "--dropout", "--router-bias-rate"})
      if (row.names == name) return true;
    return false;
  });
  for (FlagRow<TrainFlags>& row : inference_flags(help)) table.push_back(std::move(row));
  add_flags(sub, m, table);
}

void default_inference_precision(const CLI::App* sub, TrainFlags& m) {
  if (sub->get_option("--precision")->count() > 0) return;
  for (const model::PresetInfo& p : model::presets())
    if (p.name == m.model && p.published_params > 0) m.precision = "bf16";
}

bool kv_cache_fp8(const TrainFlags& m) {
  if (m.kv_cache_dtype == "auto") return false;
  if (m.kv_cache_dtype == "fp8") return true;
  throw ConfigError(fmt::format("--kv-cache-dtype: unknown \"{}\" (auto, fp8)", m.kv_cache_dtype));
}

std::optional<model::SafetensorsFile> load_inference_init(const TrainFlags& m, model::GPTConfig& config) {
  if (m.opts.init_path.empty()) return std::nullopt;
  if (m.opts.phantom) throw ConfigError("--phantom runs on shapes only: it takes no --init");
  try {
    model::SafetensorsFile init = model::load_safetensors(m.opts.init_path);
    for (int l = 0; l < config.n_layer && config.is_moe() && !config.router_bias(); ++l) {
      if (!config.is_moe_layer(l)) continue;
      if (!init.contains(model::router_bias_name(config, l))) break;
      config.router_bias_rate = 0.001;  // the biases are read from the file; the rate is training's
      const auto meta = init.metadata().find(model::kShardlabConfigKey);
      if (meta == init.metadata().end()) break;
      const auto stored = nlohmann::json::parse(meta->second, nullptr, /*allow_exceptions=*/false);
      if (stored.is_object() && stored.contains("model") && stored["model"].contains("router_bias_rate") &&
          stored["model"]["router_bias_rate"].is_number())
        config.router_bias_rate = stored["model"]["router_bias_rate"].get<double>();
    }
    infer::check_generate_init(init, config);
    return init;
  } catch (const ConfigError& e) {  // name the flag once
    const std::string what = e.what();
    throw ConfigError(what.rfind("--init", 0) == 0 ? what : "--init: " + what);
  }
}

}  // namespace shardlab::cli
