#include "cli/serve_setup.h"

#include <algorithm>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/infer_flags.h"
#include "model/infer/generate.h"
#include "model/serve/serve_checks.h"
#include "model/serve/speculative.h"
#include "runtime/errors.h"
#include "runtime/host_memory.h"
#include "runtime/transport.h"

namespace shardlab::cli {
namespace {

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

}  // namespace

Setup setup_of(ServeFlags& f) {
  Setup s;
  f.model.opts.parallel.dp = f.model.opts.parallel.ep;  // the ep ranks carry replicas of the batch
  const serve::Batching batching = serve::parse_batching(f.batching);  // every flag's syntax before what they mean
  f.serving.router = serve::parse_routing(f.router);
  if (!f.disaggregate.empty()) {
    f.serving.disaggregate = serve::parse_disaggregate(f.disaggregate);
    if (f.replicas_given)
      throw ConfigError("--disaggregate gives the replicas (prefill=N,decode=M): it takes no --replicas");
    f.serving.replicas = f.serving.disaggregate.prefill + f.serving.disaggregate.decode;
  }
  if (f.router_given && f.serving.replicas == 1)
    throw ConfigError("--router routes requests across replicas: it needs --replicas 2 or more, or --disaggregate");
  if (f.serving.router != serve::Routing::kRoundRobin && process_transport())
    throw ConfigError(fmt::format("--router {} runs the replicas side by side in one process: not across processes "
                                  "(use round-robin)", f.router));
  if (!f.workload.empty() && !f.drawn_given.empty())
    throw ConfigError(fmt::format("--workload {} gives the requests: it takes no {}", f.workload, f.drawn_given[0]));
  s.shape = {f.model.model_config(), f.model.opts.parallel.tp, f.model.opts.parallel.pp, f.model.opts.parallel.ep, f.model.opts.phantom, f.seed, nullptr};
  s.shape.sampling = sampling_of(f);
  s.shape.kv_fp8 = kv_cache_fp8(f.model);
  s.requests = f.workload.empty()
                   ? serve::make_workload(f.requests, serve::parse_arrival(f.arrival),
                                          serve::parse_length_dist(f.prompt_len, "--prompt-len"),
                                          serve::parse_length_dist(f.output_len, "--output-len"), f.seed,
                                          f.shared_prefix)
                   : serve::load_trace(f.workload);
  const bool default_lengths = !given(f, "--prompt-len") && !given(f, "--output-len");
  serve::check_requests(s.shape.model, s.requests, {f.workload, default_lengths ? kDefaultLen : 0});
  speculative_of(f, s);
  if (!f.model.opts.phantom) {
    int64_t handed = 0;  // disaggregated: every prompt's K and V may be on its way at once
    for (const serve::Request& r : s.requests) handed += f.serving.disaggregate.on() ? r.prompt_len : 0;
    // Routed other than round-robin, the replicas run side by side: every one's weights at once.
    const int at_once = f.serving.router == serve::Routing::kRoundRobin ? 1 : f.serving.replicas;
    serve::check_host_memory(s.shape, s.requests.size(), f.serving.scheduler.max_seqs, host_memory_bytes(), handed,
                             at_once);
    if (std::optional<model::SafetensorsFile> init = load_inference_init(f.model, s.shape.model)) {
      s.init = std::make_unique<model::SafetensorsFile>(std::move(*init));
      s.shape.init = s.init.get();
    }
    for (const serve::Request& r : s.requests) s.drawn_prompts = s.drawn_prompts || r.prompt.empty();
    serve::draw_prompts(s.requests, s.shape.model.token_vocab(), f.seed);
  } else if (!f.model.opts.init_path.empty()) {
    throw ConfigError("--phantom runs on shapes only: it takes no --init");
  }
  s.options = f.serving;
  s.options.scheduler.batching = batching;
  s.options.scheduler.speculative = s.shape.speculative ? s.shape.speculative->k : 0;
  // A pipeline keeps a batch in flight per stage (vLLM's virtual engines).
  s.options.scheduler.virtual_engines = s.shape.virtual_engines = s.shape.pp;
  return s;
}

}  // namespace shardlab::cli
