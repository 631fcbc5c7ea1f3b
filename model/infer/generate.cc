#include "model/infer/generate.h"

#include <algorithm>
#include <mutex>
#include <numeric>

#include <fmt/format.h>

#include "collectives/mesh.h"
#include "model/infer/infer_device.h"
#include "model/params.h"
#include "model/parallel/config_check.h"
#include "model/parallel/parallel_context.h"
#include "model/engine/model_json.h"
#include "model/engine/share_result.h"
#include "runtime/errors.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace shardlab::infer {

namespace coll = collectives;
using model::Token;

double GenerateResult::tpot_seconds() const {
  if (decode_steps.empty()) return 0;
  const Time sum = std::accumulate(decode_steps.begin(), decode_steps.end(), Time{0});
  return to_seconds(sum) / double(decode_steps.size());
}

void validate(const GenerateOptions& o) {
  o.model.validate();
  InferPlan(o.model, o.tp, o.pp, o.ep, o.kv_fp8);  // checks the split (ConfigError)
  if (o.prompt.empty()) throw ConfigError("`prompt`: the prompt needs at least one token");
  if (o.max_new_tokens < 1) throw ConfigError(fmt::format("`max_new_tokens` must be at least 1 (got {})", o.max_new_tokens));
  const int64_t total = int64_t(o.prompt.size()) + o.max_new_tokens;
  if (total > o.model.block_size)
    throw ConfigError(fmt::format("prompt ({} tokens) + `max_new_tokens` {} = {} exceeds the model's block size {} (`block_size`)",
                                  o.prompt.size(), o.max_new_tokens, total, o.model.block_size));
  for (size_t i = 0; i < o.prompt.size(); ++i)
    if (o.prompt[i] < 0 || o.prompt[i] >= o.model.token_vocab())
      throw ConfigError(fmt::format("`prompt`: token {} at position {} is outside the vocabulary [0, {})",
                                    o.prompt[i], i, o.model.token_vocab()));
  validate(o.sampling);
  if (o.phantom && o.init) throw ConfigError("`phantom` runs on shapes only: it takes no `init`");
}

void check_generate_init(const model::SafetensorsFile& f, const model::GPTConfig& config) {
  const model::ParamTable table(config);
  for (const auto& s : table.specs()) f.get(s.name, s.shape);
  engine::check_checkpoint_model(f, config, "`init`");
  for (const std::string& name : f.names())
    if (!table.find(name))
      throw ConfigError(fmt::format("`init` {}: unexpected tensor \"{}\" (not in this model: {})", f.origin(), name,
                                    config.to_string()));
}

namespace {

// One device's generation loop. `r` is shared: the sampler rank writes the
// tokens, times and logits, every rank its own kv slot.
void run_device(Device& dev, const GenerateOptions& o, const InferPlan& plan, GenerateResult& r) {
  model::PhantomScope phantom(o.phantom);
  InferDevice d(dev, plan, o.model, o.seed, o.init);
  InferEngine& engine = d.engine();
  Sampler sampler(o.sampling);
  const int seq = engine.cache().add_sequence(int(o.prompt.size()) + o.max_new_tokens);
  std::vector<Token> input = o.prompt;
  Time last = 0;
  for (int step = 0; step < o.max_new_tokens; ++step) {
    const StepOutput out = engine.step({{seq, input}});
    std::vector<float> token = d.choose(out, {true}, sampler);
    if (d.is_sampler()) {
      const int n = o.model.token_vocab();
      if (o.keep_logits && !out.logits.empty()) r.logits.emplace_back(out.logits.begin(), out.logits.begin() + n);
      const Time now = dev.compute().now();
      if (step == 0) r.ttft = now;
      else r.decode_steps.push_back(now - last);
      last = now;
      r.tokens.push_back(Token(token[0]));
    }
    if (step + 1 == o.max_new_tokens) break;  // the last token needs no forward
    d.share(token);
    input = {Token(token[0])};
  }
  r.kv_bytes[size_t(dev.rank())] = engine.cache().bytes();
  r.kv_tokens[size_t(dev.rank())] = engine.cache().tokens();
}

// Under mpirun (runtime/transport.h) each process ran its own devices: the
// per-device slots merge, and the sampler rank's process gives everyone its
// tokens, times and logits.
void share_generate_result(GenerateResult& r, const Cluster& cluster) {
  Transport* t = process_transport();
  if (!t) return;
  merge_disjoint(r.kv_bytes);
  merge_disjoint(r.kv_tokens);
  const int owner = device_owners(cluster.world_size(), t->processes(), cluster.profile())[size_t(r.sampler_rank)];
  engine::share_from_process(
      owner,
      [&](wire::Writer& w) {
        w.put_vector(r.tokens).put(r.ttft).put_vector(r.decode_steps).put<uint64_t>(r.logits.size());
        for (const auto& l : r.logits) w.put_vector(l);
      },
      [&](wire::Reader& in) {
        r.tokens = in.get_vector<Token>();
        r.ttft = in.get<Time>();
        r.decode_steps = in.get_vector<Time>();
        r.logits.resize(in.get<uint64_t>());
        for (auto& l : r.logits) l = in.get_vector<float>();
      });
}

}  // namespace

GenerateResult generate(Cluster& cluster, const GenerateOptions& o) {
  validate(o);
  const InferPlan plan(o.model, o.tp, o.pp, o.ep, o.kv_fp8);
  plan.check_cluster(cluster, "generate");
  GenerateResult r;
  r.kv_bytes.assign(size_t(plan.world), 0);
  r.kv_tokens.assign(size_t(plan.world), 0);
  r.sampler_rank = plan.sampler;
  r.run = cluster.run([&](Device& dev) { run_device(dev, o, plan, r); });
  share_generate_result(r, cluster);
  return r;
}

}  // namespace shardlab::infer
