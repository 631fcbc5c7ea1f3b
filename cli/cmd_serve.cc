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
#include "cli/serve_setup.h"
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

std::string sampling_text(const infer::SamplingOptions& o) {
  if (o.temperature <= 0) return "greedy";
  return fmt::format("sampling at temperature {} top-k {} top-p {}, request i from seed {} + i", o.temperature,
                     o.top_k, o.top_p, o.seed);
}

nlohmann::json result_json(const ServeFlags& f, const Setup& s, const serve::ReplicaPlan& plan,
                           const serve::ServeResult& r, const std::string& profile, int running, bool full) {
  nlohmann::json j;
  j["model"] = engine::model_json(s.shape.model);
  j["profile"] = profile;
  j["parallel"] = {{"tp", s.shape.tp}, {"pp", s.shape.pp}, {"ep", s.shape.ep}, {"replicas", f.serving.replicas}};
  j["router"] = f.router;
  if (const serve::Disaggregation& d = s.options.disaggregate; d.on()) {
    const serve::PhaseSummary& p = r.phases;
    j["disaggregate"] = {{"prefill_replicas", d.prefill}, {"decode_replicas", d.decode},
                         {"prefill_ttft_s", serve::percentiles_json(p.prefill_ttft_s)},
                         {"transfer_s", serve::percentiles_json(p.transfer_s)},
                         {"handoff_wait_s", serve::percentiles_json(p.handoff_wait_s)},
                         {"kv_bytes", p.kv_bytes}, {"transfers", p.transfers}};
  }
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
  const serve::Disaggregation& d = s.options.disaggregate;
  fmt::print("# shardlab serve: {} on {} ({}), {} of tp {} x pp {} x ep {}, {} batching{}\n",
             s.shape.model.to_string(), profile, f.model.precision,
             d.on() ? fmt::format("{} prefill and {} decode replica(s)", d.prefill, d.decode)
                    : fmt::format("{} replica(s)", f.serving.replicas),
             s.shape.tp, s.shape.pp, s.shape.ep, f.batching,
             f.serving.replicas > 1 ? ", routed " + f.router : "");
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
  if (d.on()) {
    const serve::PhaseSummary& p = r.phases;
    fmt::print("Disaggregated: prefill TTFT p50 {:.3f} ms p99 {:.3f} ms; {} K and V transfers, {} in all, {:.3f} ms "
               "p50 {:.3f} ms p99 on the links, {:.3f} ms p99 waiting for a port (TTFT above includes them)\n",
               p.prefill_ttft_s.p50 * 1e3, p.prefill_ttft_s.p99 * 1e3, p.transfers, format_bytes(p.kv_bytes),
               p.transfer_s.p50 * 1e3, p.transfer_s.p99 * 1e3, p.handoff_wait_s.p99 * 1e3);
  }
  if (s.options.scheduler.prefix_caching)
    fmt::print("Prefix cache: {} of {} prompt tokens found cached ({:.1f}% hit rate), their prefill skipped\n",
               m.prefix_hit_tokens, m.prefix_query_tokens, 100 * m.prefix_hit_rate);
  if (s.shape.speculative)
    fmt::print("Speculative decoding ({}, k {}): {} of {} draft tokens accepted ({:.1f}%)\n",
               s.shape.speculative->draft.to_string(), s.shape.speculative->k, m.drafts_accepted, m.drafts_proposed,
               100 * m.draft_acceptance);
  if (s.shape.phantom) return;
  int shown = 0;  // the first requests' tokens (every one is in --report)
  for (const serve::RequestRecord& q : r.requests)
    if (shown++ < 3)
      fmt::print("request {}: prompt {} -> {}\n", q.id, fmt::join(s.requests[size_t(q.id)].prompt, " "),
                 fmt::join(q.tokens, " "));
}

// Replica r's devices as ranks r·world ... in one trace (every executor's
// runs, in replica order).
std::vector<DeviceTrace> replica_traces(const std::vector<std::unique_ptr<serve::ClusterStepExecutor>>& executors) {
  std::vector<DeviceTrace> out;
  int rank = 0;
  for (const auto& executor : executors)
    for (const RunResult& run : executor->runs()) {
      for (DeviceTrace d : run.traces) {
        d.rank += rank;
        out.push_back(std::move(d));
      }
      rank += int(run.traces.size());
    }
  return out;
}

// The replicas' executors: one for all when each replica runs alone
// (round-robin: one after another on one cluster), else one per replica,
// each on a cluster of its own, side by side.
struct Executors {
  std::vector<std::unique_ptr<Cluster>> clusters;
  std::vector<std::unique_ptr<serve::ClusterStepExecutor>> all;
  std::vector<serve::StepExecutor*> steps() const {
    std::vector<serve::StepExecutor*> out;
    for (const auto& e : all) out.push_back(e.get());
    return out;
  }
};

Executors make_executors(const HardwareProfile& profile, const ClusterOptions& copts, const Setup& s) {
  Executors x;
  const int n = s.options.router == serve::Routing::kRoundRobin ? 1 : s.options.replicas;
  for (int r = 0; r < n; ++r) {
    x.clusters.push_back(std::make_unique<Cluster>(profile, copts));
    x.all.push_back(std::make_unique<serve::ClusterStepExecutor>(*x.clusters.back(), s.shape));
  }
  return x;
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
  Executors executors;
  serve::ReplicaPlan plan;
  serve::ServeResult r;
  for (;;) {
    executors = make_executors(profile, copts, s);
    try {
      // A step holds at most max_batch_tokens tokens, or one per sequence when more run.
      plan = executors.all[0]->plan(std::max<int64_t>(f.serving.scheduler.max_batch_tokens, f.serving.scheduler.max_seqs));
      s.options.scheduler.kv_blocks = plan.kv_blocks(f.kv_fraction, f.serving.scheduler.kv_block);
      if (s.options.scheduler.kv_blocks == 0)
        throw ConfigError(fmt::format("no room for a KV cache: weights and activations fill --kv-fraction {} of the "
                                      "device; raise --tp/--pp or --memory, or lower --max-batch-tokens",
                                      f.kv_fraction));
      std::optional<serve::KvTransfer> transfer;
      if (const serve::Disaggregation& d = s.options.disaggregate; d.on())
        transfer.emplace(profile, d.prefill, d.decode, plan.kv_bytes_per_token);
      const std::vector<serve::StepExecutor*> steps = executors.steps();
      r = serve::simulate_serving(s.requests, s.options, steps, transfer ? &*transfer : nullptr);
      for (const auto& e : executors.all) e->finish();
      break;
    } catch (const RunError& e) {
      if (!e.folding() || !s.shape.fold) throw;
      s.shape.fold = false;  // exact unfolded: run again
    }
  }
  const std::string title = fmt::format("shardlab serve {}", s.shape.model.to_string());
  const int threads = executors.all[0]->running_devices();
  if (leader_process()) {  // across processes (runtime/transport.h): one set of files
    write_outputs({{"--report", f.model.report,
                    f.model.report.empty() ? "" : result_json(f, s, plan, r, profile.name, threads, true).dump(2)},
                   {"--trace", f.model.common.trace,
                    copts.trace ? chrome_trace_json(replica_traces(executors.all), title) : ""}});
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
      {"--router", FIELD(router),
       "How requests are routed across replicas: round-robin, least-loaded (fewest unfinished) or prefix (the "
       "longest cached prefix, with --prefix-caching; else least-loaded)",
       {}, kShowDefault},
      {"--disaggregate", FIELD(disaggregate),
       "prefill=N,decode=M: N prefill replicas hand each request's K and V over the network to M decode "
       "replicas (in place of --replicas)",
       nonempty()},
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
    f->replicas_given = sub->get_option("--replicas")->count() > 0;
    f->router_given = sub->get_option("--router")->count() > 0;
    for (const CLI::Option* o : drawn)
      if (o->count() > 0) f->drawn_given.push_back(o->get_name());
    return run_serve(*f);
  });
}

}  // namespace shardlab::cli
