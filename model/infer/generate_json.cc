#include "model/infer/generate_json.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "model/infer/infer_plan.h"

namespace shardlab::infer {

nlohmann::json generate_json(const GenerateOptions& o, const GenerateResult& r) {
  const collectives::DeviceMesh mesh = InferPlan(o.model, o.tp, o.pp, o.ep).mesh;
  nlohmann::json j;
  j["parallel"] = {{"tp", o.tp}, {"pp", o.pp}, {"ep", o.ep}};
  j["phantom"] = o.phantom;
  j["sampling"] = {{"temperature", o.sampling.temperature}, {"top_k", o.sampling.top_k}, {"top_p", o.sampling.top_p}, {"seed", o.sampling.seed}};
  j["prompt"] = o.prompt;
  j["tokens"] = r.tokens;
  j["ttft_s"] = to_seconds(r.ttft);
  j["tpot_s"] = r.tpot_seconds();
  std::vector<double> steps;
  for (Time t : r.decode_steps) steps.push_back(to_seconds(t));
  j["decode_step_s"] = steps;
  j["sampler_rank"] = r.sampler_rank;
  j["devices"] = nlohmann::json::array();
  for (const DeviceStats& d : r.run.devices) {
    nlohmann::json kinds;
    for (int k = 0; k < kNumMemKinds; ++k) kinds[mem_kind_name(MemKind(k))] = d.peak_by_kind[k];
    j["devices"].push_back({{"rank", d.rank}, {"name", mesh.describe(d.rank)},
                            {"kv_cache_bytes", r.kv_bytes[size_t(d.rank)]},
                            {"kv_tokens", r.kv_tokens[size_t(d.rank)]}, {"peak_bytes", d.peak_bytes},
                            {"peak_bytes_by_kind", kinds}});
  }
  return j;
}

}  // namespace shardlab::infer
