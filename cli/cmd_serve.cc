// `shardlab serve`: a serving simulation on the virtual cluster
// (model/serve/): requests arrive in virtual time, a scheduler per replica
// batches them (static or continuous) over a paged KV cache, and every step
// runs on one replica's devices (model/serve/cluster_step.h). Reports TTFT,
// TPOT and end-to-end latency percentiles, throughput and the KV cache's
// capacity and use.
#include <algorithm>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "cli/infer_flags.h"
#include "model/serve/cluster_step.h"
#include "model/serve/serve_checks.h"
#include "model/serve/serve_json.h"
#include "model/serve/serving.h"
#include "model/serve/speculative.h"
#include "model/infer/generate.h"
#include "model/engine/model_json.h"
#include "runtime/errors.h"
#include "runtime/host_memory.h"
#include "runtime/trace.h"
#include "runtime/transport.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

constexpr int kDefaultLen = 128;  // --prompt-len and --output-len unless given

struct ServeFlags {
  TrainFlags model;  // the shape flags, --tp --pp --ep, --memory, --precision, --phantom, --init, common flags
  serve::ServeOptions serving;  // --replicas and the scheduler's --max-seqs, --kv-block, ... bind here
  infer::SamplingOptions sampling;  // --temperature, --top-k, --top-p (the seed is --seed's)
  int requests = 100;
  int shared_prefix = 0;  // tokens every drawn prompt starts with
  std::string arrival = "poisson:1", prompt_len = std::to_string(kDefaultLen), output_len = prompt_len, workload;
  std::string batching = "continuous";
  std::string speculative, draft_init;  // --speculative draft=PRESET,k=N[,accept=P], --draft-init FILE
  double kv_fraction = 0.9;
  uint64_t seed = 1337;
  std::vector<std::string> drawn_given;  // which of --requests, --arrival, --prompt-len, --output-len were given
};

struct Setup {
  serve::ReplicaShape shape;
  serve::ServeOptions options;
  std::vector<serve::Request> requests;
  std::unique_ptr<model::SafetensorsFile> init;  // shape.init points here
  std::unique_ptr<model::SafetensorsFile> draft_init;  // shape.speculative->draft_init points here
  bool drawn_prompts = false;                    // some prompts drawn from --seed (a workload of lengths)
};

bool given(const ServeFlags& f, std::string_view flag) {
  return std::find(f.drawn_given.begin(), f.drawn_given.end(), flag) != f.drawn_given.end();
}

// Request i draws from --seed + i; a phantom run chooses no token, so a
// sampling flag there means nothing.
infer::SamplingOptions sampling_of(const ServeFlags& f) {
  infer::SamplingOptions o = f.sampling;
  o.seed = f.seed;
  infer::validate(o);
  const infer::SamplingOptions greedy;
  if (f.model.opts.phantom && (o.temperature != greedy.temperature || o.top_k != greedy.top_k || o.top_p != greedy.top_p))
    throw ConfigError("--phantom computes no tokens: it takes no --temperature, --top-k or --top-p");
  return o;
}

std::string sampling_text(const infer::SamplingOptions& o) {
  if (o.temperature <= 0) return "greedy";
  return fmt::format("sampling at temperature {} top-k {} top-p {}, request i from seed {} + i", o.temperature,
                     o.top_k, o.top_p, o.seed);
}

// The draft model of --speculative: the preset's shape at the target's
// context and vocabulary padding; weights from --draft-init or --seed. A phantom run takes the
// acceptance rate (accept=), a run on values measures it.
void speculative_of(const ServeFlags& f, Setup& s) {
  if (f.speculative.empty()) {
    if (!f.draft_init.empty()) throw ConfigError("--draft-init is the draft model's: it needs --speculative");
    return;
  }
  const serve::SpeculativeSpec spec = serve::parse_speculative(f.speculative);
  const bool phantom = s.shape.phantom;
  if (phantom && spec.accept < 0)
    throw ConfigError("--phantom computes no tokens: --speculative needs accept=P, the draft's acceptance rate");
  if (!phantom && spec.accept >= 0)
    throw ConfigError("--speculative accept= is for --phantom: on the model's values the acceptance is measured");
  if (phantom && !f.draft_init.empty()) throw ConfigError("--phantom runs on shapes only: it takes no --draft-init");
  if (f.serving.scheduler.prefix_caching)
    throw ConfigError("--speculative with --prefix-caching: the draft's cache shares no blocks (not built)");
  serve::SpeculativeShape sp{model::preset(spec.draft), nullptr, f.seed, spec.k, spec.accept};
  sp.draft.block_size = s.shape.model.block_size;
  if (sp.draft.token_vocab() == s.shape.model.token_vocab()) {  // the target's padded table
    sp.draft.vocab_size = s.shape.model.vocab_size;
    sp.draft.vocab_unpadded = s.shape.model.vocab_unpadded;
    sp.draft.vocab_multiple = s.shape.model.vocab_multiple;
  }
  if (!f.draft_init.empty()) {
    try {
      s.draft_init = std::make_unique<model::SafetensorsFile>(model::load_safetensors(f.draft_init));
      infer::check_generate_init(*s.draft_init, sp.draft);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("--draft-init: ") + e.what());
    }
    sp.draft_init = s.draft_init.get();
  }
  s.shape.speculative = sp;
}

Setup setup_of(ServeFlags& f) {
  Setup s;
  f.model.opts.parallel.dp = f.model.opts.parallel.ep;  // the ep ranks carry replicas of the batch
  const serve::Batching batching = serve::parse_batching(f.batching);  // every flag's syntax before what they mean
  if (!f.workload.empty() && !f.drawn_given.empty())
    throw ConfigError(fmt::format("--workload {} gives the requests: it takes no {}", f.workload, f.drawn_given[0]));
  s.shape = {f.model.model_config(), f.model.opts.parallel.tp, f.model.opts.parallel.pp, f.model.opts.parallel.ep, f.model.opts.phantom, f.seed, nullptr};
  s.shape.sampling = sampling_of(f);
  s.requests = f.workload.empty()
                   ? serve::make_workload(f.requests, serve::parse_arrival(f.arrival),
                                          serve::parse_length_dist(f.prompt_len, "--prompt-len"),
                                          serve::parse_length_dist(f.output_len, "--output-len"), f.seed,
                                          f.shared_prefix)
                   : serve::load_trace(f.workload);
  const bool default_lengths = !given(f, "--prompt-len") && !given(f, "--output-len");
  serve::check_requests(s.shape.model, s.requests, {f.workload, default_lengths ? kDefaultLen : 0});
  if (!f.model.opts.phantom) {
    serve::check_host_memory(s.shape, s.requests.size(), f.serving.scheduler.max_seqs, host_memory_bytes());
    if (std::optional<model::SafetensorsFile> init = load_inference_init(f.model, s.shape.model)) {
      s.init = std::make_unique<model::SafetensorsFile>(std::move(*init));
      s.shape.init = s.init.get();
    }
    for (const serve::Request& r : s.requests) s.drawn_prompts = s.drawn_prompts || r.prompt.empty();
    serve::draw_prompts(s.requests, s.shape.model.token_vocab(), f.seed);
  } else if (!f.model.opts.init_path.empty()) {
    throw ConfigError("--phantom runs on shapes only: it takes no --init");
  }
  speculative_of(f, s);
  s.options = f.serving;
  s.options.scheduler.batching = batching;
  s.options.scheduler.speculative = s.shape.speculative ? s.shape.speculative->k : 0;
  // A pipeline keeps a batch in flight per stage (vLLM's virtual engines).
  s.options.scheduler.virtual_engines = s.shape.virtual_engines = s.shape.pp;
  return s;
}

nlohmann::json result_json(const ServeFlags& f, const Setup& s, const serve::ReplicaPlan& plan,
                           const serve::ServeResult& r, const std::string& profile, int running, bool full) {
  nlohmann::json j;
  j["model"] = engine::model_json(s.shape.model);
  j["profile"] = profile;
  j["parallel"] = {{"tp", s.shape.tp}, {"pp", s.shape.pp}, {"ep", s.shape.ep}, {"replicas", f.serving.replicas}};
  j["phantom"] = s.shape.phantom;
  j["running_devices"] = running;  // device threads per replica: fewer when --phantom folds the tp peers
  j["init"] = f.model.opts.init_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.model.opts.init_path);
  const serve::SchedulerOptions& o = s.options.scheduler;
  j["scheduler"] = {{"batching", f.batching}, {"kv_block", o.kv_block}, {"kv_blocks", o.kv_blocks},
                    {"kv_fraction", f.kv_fraction}, {"max_seqs", o.max_seqs},
                    {"max_batch_tokens", o.max_batch_tokens}, {"chunked_prefill", o.chunked_prefill},
                    {"prefix_caching", o.prefix_caching}, {"virtual_engines", o.virtual_engines}};
  if (const auto& sp = s.shape.speculative)
    j["speculative"] = {{"draft", sp->draft.to_string()}, {"k", sp->k},
                        {"accept", sp->accept < 0 ? nlohmann::json(nullptr) : nlohmann::json(sp->accept)},
                        {"draft_init", f.draft_init.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.draft_init)}};
  const infer::SamplingOptions& so = s.shape.sampling;
  j["sampling"] = {{"temperature", so.temperature}, {"top_k", so.top_k}, {"top_p", so.top_p}, {"seed", so.seed}};
  j["workload"] = f.workload.empty()
                      ? nlohmann::json{{"requests", f.requests}, {"arrival", f.arrival}, {"prompt_len", f.prompt_len},
                                       {"output_len", f.output_len}, {"shared_prefix", f.shared_prefix}, {"seed", f.seed}}
                      : nlohmann::json{{"file", f.workload}, {"requests", s.requests.size()}};
  j["replica_devices"] = serve::plan_json(plan);
  j["summary"] = serve::summary_json(r.summary);
  if (!full) return j;
  j["requests"] = serve::requests_json(r, s.shape.phantom ? nullptr : &s.requests);
  j["usage"] = serve::usage_json(r);
  return j;
}

void print_result(const ServeFlags& f, const Setup& s, const serve::ReplicaPlan& plan, const serve::ServeResult& r,
                  const std::string& profile) {
  const serve::ServeSummary& m = r.summary;
  fmt::print("# shardlab serve: {} on {} ({}), {} replica(s) of tp {} x pp {} x ep {}, {} batching\n",
             s.shape.model.to_string(), profile, f.model.precision, f.serving.replicas, s.shape.tp, s.shape.pp, s.shape.ep,
             f.batching);
  if (s.shape.pp > 1)
    fmt::print("({} batches in flight through the {} stages: a scheduler each, with 1/{} of the KV blocks)\n", s.shape.pp,
               s.shape.pp, s.shape.pp);
  if (s.shape.phantom)
    fmt::print("(--phantom: every step runs on the replica's devices on shapes only; the times and memory are the modeled run's)\n");
  else
    fmt::print("(every step runs on the model's values, {}; {}; {}; --report has every request's tokens)\n",
               f.model.opts.init_path.empty() ? fmt::format("weights initialised from --seed {}", f.seed) : "weights from --init " + f.model.opts.init_path,
               s.drawn_prompts ? fmt::format("prompts of random token ids from --seed {}", f.seed)
                               : "prompts from --workload " + f.workload,
               sampling_text(s.shape.sampling));
  fmt::print("KV cache per replica: {} tokens ({} blocks of {}); per device: weights {}, step activations {}\n",
             m.kv_capacity_tokens, s.options.scheduler.kv_blocks, f.serving.scheduler.kv_block, format_bytes(plan.weight_bytes[0]),
             format_bytes(plan.activation_bytes[0]));
  fmt::print("{} requests in {:.3f} s: {:.2f} req/s, {:.1f} output tokens/s, {:.1f} tokens/s in all\n", m.requests,
             m.makespan_s, m.requests_per_s, m.output_tokens_per_s, m.total_tokens_per_s);
  fmt::print("{:<8} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "", "mean ms", "p50 ms", "p90 ms", "p99 ms", "max ms");
  for (auto [name, p] : {std::pair{"TTFT", &m.ttft_s}, std::pair{"TPOT", &m.tpot_s}, std::pair{"E2E", &m.e2e_s}})
    fmt::print("{:<8} {:>11.3f} {:>11.3f} {:>11.3f} {:>11.3f} {:>11.3f}\n", name, p->mean * 1e3, p->p50 * 1e3,
               p->p90 * 1e3, p->p99 * 1e3, p->max * 1e3);
  fmt::print("KV cache use: peak {:.1f}%, mean {:.1f}% (over busy time); {} preemptions; {} steps\n",
             100 * m.kv_peak_use, 100 * m.kv_mean_use, m.preemptions, m.steps);
  if (s.options.scheduler.prefix_caching)
    fmt::print("Prefix cache: {} of {} prompt tokens found cached ({:.1f}% hit rate), their prefill skipped\n",
               m.prefix_hit_tokens, m.prefix_query_tokens, 100 * m.prefix_hit_rate);
  if (s.shape.speculative)
    fmt::print("Speculative decoding ({}, k {}): {} of {} draft tokens accepted ({:.1f}%)\n",
               s.shape.speculative->draft.to_string(), s.shape.speculative->k, m.drafts_accepted, m.drafts_proposed,
               100 * m.draft_acceptance);
  if (s.shape.phantom) return;
  int shown = 0;  // the first requests' tokens (every one is in --report)
  for (const serve::ReplicaResult& rep : r.replicas)
    for (const serve::RequestRecord& q : rep.requests)
      if (shown++ < 3)
        fmt::print("request {}: prompt {} -> {}\n", q.id, fmt::join(s.requests[size_t(q.id)].prompt, " "),
                   fmt::join(q.tokens, " "));
}

// Replica r's devices as ranks r·world ... in one trace.
std::vector<DeviceTrace> replica_traces(const serve::ClusterStepExecutor& executor) {
  std::vector<DeviceTrace> out;
  const std::vector<RunResult>& runs = executor.runs();
  for (size_t r = 0; r < runs.size(); ++r)
    for (DeviceTrace d : runs[r].traces) {
      d.rank += int(r * runs[r].traces.size());
      out.push_back(std::move(d));
    }
  return out;
}

int run_serve(ServeFlags& f) {
  const HardwareProfile profile = apply_common(f.model.common);
  Setup s = setup_of(f);
  const int64_t devices = int64_t{s.shape.world()} * f.serving.replicas;
  if (devices > profile.total_devices())
    throw ConfigError(fmt::format("{} replicas of {} devices need {} devices, the profile has {} (--nodes)", f.serving.replicas,
                                  s.shape.world(), devices, profile.total_devices()));
  check_outputs({{"--report", f.model.report}, {"--trace", f.model.common.trace}});
  ClusterOptions copts = f.model.cluster_options();
  copts.world_size = s.shape.world();
  copts.trace = !f.model.common.trace.empty();
  // Folding keeps every figure; a trace wants every device's timeline.
  s.shape.fold = !f.model.no_fold && !copts.trace;
  Cluster cluster(profile, copts);
  std::unique_ptr<serve::ClusterStepExecutor> executor;
  serve::ReplicaPlan plan;
  serve::ServeResult r;
  for (;;) {
    executor = std::make_unique<serve::ClusterStepExecutor>(cluster, s.shape);
    try {
      // A step holds at most max_batch_tokens tokens, or one per sequence when more run.
      plan = executor->plan(std::max<int64_t>(f.serving.scheduler.max_batch_tokens, f.serving.scheduler.max_seqs));
      s.options.scheduler.kv_blocks = plan.kv_blocks(f.kv_fraction, f.serving.scheduler.kv_block);
      if (s.options.scheduler.kv_blocks == 0)
        throw ConfigError(fmt::format("no room for a KV cache: weights and activations fill --kv-fraction {} of the "
                                      "device; raise --tp/--pp or --memory, or lower --max-batch-tokens",
                                      f.kv_fraction));
      r = serve::simulate_serving(s.requests, s.options, *executor);
      executor->finish();
      break;
    } catch (const RunError& e) {
      if (!e.folding() || !s.shape.fold) throw;
      s.shape.fold = false;  // exact unfolded: run again
    }
  }
  const std::string title = fmt::format("shardlab serve {}", s.shape.model.to_string());
  const int threads = executor->running_devices();
  if (leader_process()) {  // across processes (runtime/transport.h): one set of files
    write_outputs({{"--report", f.model.report,
                    f.model.report.empty() ? "" : result_json(f, s, plan, r, profile.name, threads, true).dump(2)},
                   {"--trace", f.model.common.trace,
                    copts.trace ? chrome_trace_json(replica_traces(*executor), title) : ""}});
  }
  if (f.model.common.json) print_json(result_json(f, s, plan, r, profile.name, threads, false));
  else print_result(f, s, plan, r, profile.name);
  return 0;
}

#define FIELD(path) FLAG_FIELD(ServeFlags, path)

FlagTable<ServeFlags> serve_flags() {
  const std::string lengths = "N, uniform:A:B or lognormal:MEDIAN:SIGMA[:MAX]";
  return {
      {"--replicas", FIELD(serving.replicas), "Data-parallel replicas", number_in(1, double(kMaxDevices)),
       kShowDefault},
      {"--no-fold", FIELD(model.no_fold), "With --phantom, run every tp rank's thread (folding changes no figure)"},
      {"--requests", FIELD(requests), "Requests to draw", number_in(1, 1e6), kShowDefault},
      {"--arrival", FIELD(arrival), "poisson:RATE (requests/s) or burst", {}, kShowDefault},
      {"--prompt-len", FIELD(prompt_len), lengths, {}, kShowDefault},
      {"--output-len", FIELD(output_len), lengths, {}, kShowDefault},
      {"--workload", FIELD(workload), "Requests from FILE.csv: arrival_s,prompt_len,output_len[,prompt_tokens]",
       nonempty()},
      {"--shared-prefix", FIELD(shared_prefix),
       "Every drawn prompt starts with the same LEN tokens (a system prompt), then its --prompt-len tokens",
       number_in(0, 1 << 24), kShowDefault},
      {"--batching", FIELD(batching), "static or continuous", {}, kShowDefault},
      {"--prefix-caching", FIELD(serving.scheduler.prefix_caching),
       "Share the KV blocks of equal prompt prefixes between requests (named by content, evicted LRU)"},
      {"--max-batch-tokens", FIELD(serving.scheduler.max_batch_tokens), "Tokens per step", number_in(1, 1 << 24),
       kShowDefault},
      {"--max-seqs", FIELD(serving.scheduler.max_seqs), "Sequences per step", number_in(1, 1 << 20), kShowDefault},
      {"--kv-block", FIELD(serving.scheduler.kv_block), "Tokens per KV block", number_in(1, 1 << 16), kShowDefault},
      {"--kv-fraction", FIELD(kv_fraction), "Share of device memory for weights, activations and KV cache",
       number_in(0.01, 1), kShowDefault},
      {"--chunked-prefill", FIELD(serving.scheduler.chunked_prefill), "At most C prefill tokens per step (0 = off)",
       number_in(0, 1 << 24), kShowDefault},
      {"--speculative", FIELD(speculative),
       "draft=PRESET,k=N[,accept=P]: a draft model proposes k tokens a decode, the target verifies them in one "
       "step (greedy, or Leviathan's rejection rule when sampling); accept= is --phantom's acceptance rate",
       nonempty()},
      {"--draft-init", FIELD(draft_init), "The draft model's weights from FILE.safetensors (default: from --seed)",
       nonempty()},
      {"--temperature", FIELD(sampling.temperature), "Sampling temperature (0 = greedy)", number_in(0, 1e6),
       kShowDefault},
      {"--top-k", FIELD(sampling.top_k), "Sample among the K most likely tokens (0 = all)", number_in(0, 1 << 24),
       kShowDefault},
      {"--top-p", FIELD(sampling.top_p), "Sample among the most likely tokens whose probability reaches P (1 = all)",
       number_in(0, 1), kShowDefault},
      {"--seed", FIELD(seed), "Seed of the workload (arrivals, lengths, prompt tokens), of the sampling (request i: seed + i) and, "
       "without --init, of the weights",
       number_in(0, 1.8e19), kShowDefault},
      {"--report", FIELD(model.report), "Write the report (config, summary, every request, KV use per step) to FILE.json",
       nonempty()},
  };
}

#undef FIELD

}  // namespace

void add_serve_command(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "Serving simulation: arrivals, batching, paged KV cache, TTFT/TPOT");
  auto f = std::make_shared<ServeFlags>();
  add_common_flags(sub, f->model.common);
  add_inference_flags(sub, f->model, {"Expert-parallel degree of a replica (MoE; replicas of the batch)", "40GiB",
                                      "Shapes only: time every step, compute no token (for models too big for this host)"});
  add_flags(sub, *f, serve_flags());
  // What --workload replaces: drawn requests.
  std::vector<const CLI::Option*> drawn;
  for (const char* name : {"--requests", "--arrival", "--prompt-len", "--output-len", "--shared-prefix"})
    drawn.push_back(sub->get_option(name));
  set_action(sub, [f, drawn, sub] {
    default_inference_precision(sub, f->model);
    for (const CLI::Option* o : drawn)
      if (o->count() > 0) f->drawn_given.push_back(o->get_name());
    return run_serve(*f);
  });
}

}  // namespace shardlab::cli
