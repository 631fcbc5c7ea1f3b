#include "cli/infer_flags.h"

#include <tuple>

#include "cli/cli.h"
#include "model/infer/generate.h"
#include "runtime/errors.h"

namespace shardlab::cli {

void add_inference_flags(CLI::App* sub, TrainFlags& m, const InferenceFlagHelp& help) {
  add_model_flags(sub, m);
  sub->remove_option(sub->get_option("--top-k"));
  sub->add_option("--moe-top-k", m.top_k, "MoE experts per token")->capture_default_str()->check(number_in(1, 1 << 16));
  sub->add_option("--init", m.opts.init_path, "Weights from FILE.safetensors (strict: exactly the model's tensors)")
      ->check(nonempty());
  for (auto [name, field, text] : {std::tuple{"--tp", &m.opts.parallel.tp, std::string("Tensor-parallel degree")},
                                   std::tuple{"--pp", &m.opts.parallel.pp, std::string("Pipeline stages")},
                                   std::tuple{"--ep", &m.opts.parallel.ep, help.ep}})
    sub->add_option(name, *field, text)->capture_default_str()->check(number_in(1, double(kMaxDevices)));
  sub->add_option("--memory", m.memory, "Per-device memory, e.g. " + help.memory + " (default: the profile's)")
      ->check(nonempty());
  sub->add_option("--precision", m.precision, "Modeled precision: fp32 or bf16")->capture_default_str();
  sub->add_flag("--phantom", m.opts.phantom, help.phantom);
}

std::optional<model::SafetensorsFile> load_inference_init(const TrainFlags& m, const model::GPTConfig& config) {
  if (m.opts.init_path.empty()) return std::nullopt;
  if (m.opts.phantom) throw ConfigError("--phantom runs on shapes only: it takes no --init");
  try {
    model::SafetensorsFile init = model::load_safetensors(m.opts.init_path);
    infer::check_generate_init(init, config);
    return init;
  } catch (const ConfigError& e) {  // name the flag once
    const std::string what = e.what();
    throw ConfigError(what.rfind("--init", 0) == 0 ? what : "--init: " + what);
  }
}

}  // namespace shardlab::cli
