// `shardlab generate`: autoregressive generation with a KV cache on the
// virtual cluster (model/infer/generate.h): the tokens, TTFT, TPOT and the
// KV cache per device.
#include <cctype>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "cli/infer_flags.h"
#include "model/infer/generate.h"
#include "model/infer/generate_json.h"
#include "model/engine/model_json.h"
#include "runtime/errors.h"
#include "runtime/input_file.h"
#include "runtime/parse_number.h"
#include "runtime/trace.h"
#include "runtime/transport.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

struct GenerateFlags {
  TrainFlags model;  // the shape flags (--model, --layers, ...), --tp --pp, --memory, --precision
  infer::GenerateOptions gen;  // --max-new-tokens, --temperature, --top-k and --seed bind here
  std::string prompt_tokens, prompt_file;
};

// "1,2,3" (commas or white space between ids) -> tokens; one error line
// naming `what` for anything else, an empty id between commas included
// ("1,,2" is a missing id, not two).
std::vector<model::Token> parse_tokens(const std::string& text, const std::string& what) {
  std::vector<model::Token> out;
  std::string item;
  bool id_since_comma = false;
  auto flush = [&] {
    if (item.empty()) return;
    const std::optional<model::Token> id = parse_number<model::Token>(item);
    if (!id || *id < 0 || item[0] == '-')
      throw ConfigError(fmt::format("{}: \"{}\" is not a token id (a non-negative integer)", what, item));
    out.push_back(*id);
    item.clear();
    id_since_comma = true;
  };
  auto empty_id = [&] { return ConfigError(fmt::format("{}: an empty token id after id {}", what, out.size())); };
  for (char ch : text) {
    if (ch == ',') {
      flush();
      if (!id_since_comma) throw empty_id();
      id_since_comma = false;
    } else if (std::isspace(static_cast<unsigned char>(ch))) {
      flush();
    } else {
      item += ch;
    }
  }
  flush();
  if (out.empty()) throw ConfigError(fmt::format("{}: no token ids", what));
  if (!id_since_comma) throw empty_id();
  return out;
}

std::vector<model::Token> prompt_of(const GenerateFlags& f) {
  if (f.prompt_tokens.empty() == f.prompt_file.empty())
    throw ConfigError("give the prompt with exactly one of --prompt-tokens 1,2,3 and --prompt-file FILE");
  if (!f.prompt_tokens.empty()) return parse_tokens(f.prompt_tokens, "--prompt-tokens");
  const std::string what = "--prompt-file " + f.prompt_file;
  return parse_tokens(read_input(what, f.prompt_file, "a text file", size_t(64) << 20), what);
}

// The library's result, with the model, the profile and --init.
nlohmann::json result_json(const infer::GenerateOptions& o, const GenerateFlags& f, const infer::GenerateResult& r,
                           const HardwareProfile& profile) {
  nlohmann::json j = infer::generate_json(o, r);
  j["model"] = engine::model_json(o.model);
  j["profile"] = profile.name;
  j["init"] = f.model.opts.init_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.model.opts.init_path);
  return j;
}

void print_result(const infer::GenerateOptions& o, const GenerateFlags& f, const nlohmann::json& j) {
  const std::string sampling = o.sampling.temperature > 0
                                   ? fmt::format("sampling at temperature {} top-k {} top-p {} seed {}",
                                                 o.sampling.temperature, o.sampling.top_k, o.sampling.top_p,
                                                 o.sampling.seed)
                                   : "greedy";
  fmt::print("# shardlab generate: {} on {} ({}), tp {} x pp {} x ep {}, {}\n", o.model.to_string(),
             j["profile"].get<std::string>(), f.model.precision, o.tp, o.pp, o.ep, sampling);
  if (o.phantom) fmt::print("(--phantom: shapes only; every token is 0, the times and memory are the real run's)\n");
  else if (f.model.opts.init_path.empty()) fmt::print("(no --init: weights randomly initialised from --seed {})\n", f.gen.seed);
  fmt::print("prompt ({} tokens): {}\n", o.prompt.size(), fmt::join(o.prompt, " "));
  fmt::print("tokens ({} new): {}\n", o.max_new_tokens, fmt::join(j["tokens"].get<std::vector<int>>(), " "));
  fmt::print("TTFT {:.4f} ms (prefill of {} tokens), TPOT {:.4f} ms (mean of {} decode steps), virtual\n",
             j["ttft_s"].get<double>() * 1e3, o.prompt.size(), j["tpot_s"].get<double>() * 1e3,
             j["decode_step_s"].size());
  fmt::print("{:>4}  {:<28} {:>12} {:>10} {:>12} {:>12}\n", "rank", "mesh position", "kv cache", "kv tokens",
             "params", "peak memory");
  for (const auto& d : j["devices"])
    fmt::print("{:>4}  {:<28} {:>12} {:>10} {:>12} {:>12}\n", d["rank"].get<int>(), d["name"].get<std::string>(),
               format_bytes(d["kv_cache_bytes"].get<uint64_t>()), d["kv_tokens"].get<int64_t>(),
               format_bytes(d["peak_bytes_by_kind"]["param"].get<uint64_t>()),
               format_bytes(d["peak_bytes"].get<uint64_t>()));
}

int run_generate(GenerateFlags& f) {
  const HardwareProfile profile = apply_common(f.model.common);
  f.model.opts.parallel.dp = f.model.opts.parallel.ep;  // the ep ranks carry replicas of the sequences
  infer::GenerateOptions o = f.gen;
  o.model = f.model.model_config();
  o.prompt = prompt_of(f);
  o.sampling.seed = o.seed;
  o.tp = f.model.opts.parallel.tp;
  o.pp = f.model.opts.parallel.pp;
  o.ep = f.model.opts.parallel.ep;
  o.phantom = f.model.opts.phantom;
  o.kv_fp8 = kv_cache_fp8(f.model);
  if (o.phantom && !f.model.opts.init_path.empty()) throw ConfigError("--phantom runs on shapes only: it takes no --init");
  infer::validate(o);
  const ClusterOptions copts = f.model.cluster_options();
  check_outputs({{"--trace", f.model.common.trace}});
  const std::optional<model::SafetensorsFile> init = load_inference_init(f.model, o.model);
  if (init) o.init = &*init;
  Cluster cluster(profile, copts);
  const infer::GenerateResult r = infer::generate(cluster, o);
  const nlohmann::json j = result_json(o, f, r, profile);
  if (leader_process())  // across processes (runtime/transport.h): one set of files
    write_outputs({{"--trace", f.model.common.trace,
                    f.model.common.trace.empty()
                        ? ""
                        : chrome_trace_json(r.run.traces, fmt::format("shardlab generate {}", o.model.to_string()))}});
  if (f.model.common.json) print_json(j);
  else print_result(o, f, j);
  return 0;
}

#define FIELD(path) FLAG_FIELD(GenerateFlags, path)

FlagTable<GenerateFlags> generate_flags() {
  return {
      {"--prompt-tokens", FIELD(prompt_tokens), "The prompt as token ids: 1,2,3"},
      {"--prompt-file", FIELD(prompt_file), "The prompt from FILE: token ids separated by commas or spaces",
       nonempty()},
      {"--max-new-tokens", FIELD(gen.max_new_tokens), "Tokens to generate", number_in(1, 1 << 20), kShowDefault},
      {"--temperature", FIELD(gen.sampling.temperature), "Sampling temperature (0 = greedy)", number_in(0, 1e6),
       kShowDefault},
      {"--top-k", FIELD(gen.sampling.top_k), "Sample among the K most likely tokens (0 = all)", number_in(0, 1 << 24),
       kShowDefault},
      {"--top-p", FIELD(gen.sampling.top_p), "Sample among the most likely tokens whose probability reaches P "
       "(1 = all)", number_in(0, 1), kShowDefault},
      {"--seed", FIELD(gen.seed), "Seed of the init (without --init) and of the sampling", number_in(0, 1.8e19),
       kShowDefault},
  };
}

#undef FIELD

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Generate tokens with a KV cache (prefill, then decode) on the virtual cluster");
  auto f = std::make_shared<GenerateFlags>();
  add_common_flags(sub, f->model.common);
  // --top-k is sampling's here (the contract's name); the MoE routing's is --moe-top-k.
  add_inference_flags(sub, f->model, {"Expert-parallel degree (MoE; replicas of the batch)", "64MiB",
                                      "Shapes only: time every kernel, collective and allocation, compute nothing"});
  add_flags(sub, *f, generate_flags());
  set_action(sub, [f, sub] {
    default_inference_precision(sub, f->model);
    return run_generate(*f);
  });
}

}  // namespace shardlab::cli
