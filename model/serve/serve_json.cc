#include "model/serve/serve_json.h"

#include <nlohmann/json.hpp>

namespace shardlab::serve {

nlohmann::json plan_json(const ReplicaPlan& p) {
  nlohmann::json devices = nlohmann::json::array();
  for (size_t d = 0; d < p.weight_bytes.size(); ++d)
    devices.push_back({{"rank", d}, {"capacity_bytes", p.capacity_bytes[d]}, {"weight_bytes", p.weight_bytes[d]},
                       {"activation_bytes", p.activation_bytes[d]}, {"kv_bytes_per_token", p.kv_bytes_per_token[d]}});
  return devices;
}

nlohmann::json requests_json(const ServeResult& result, const std::vector<Request>* prompts) {
  nlohmann::json out = nlohmann::json::array();
  for (const RequestRecord& q : result.requests) {
    nlohmann::json one = {{"id", q.id}, {"replica", q.replica}, {"arrival_s", q.arrival_s},
                          {"first_token_s", q.first_token_s}, {"finish_s", q.finish_s},
                          {"prompt_len", q.prompt_len}, {"output_len", q.output_len},
                          {"preemptions", q.preemptions}, {"cached_tokens", q.cached_tokens}};
    if (size_t(q.id) < result.handoffs.size() && q.output_len > 1) {  // disaggregated: its K and V's way
      const Handoff& h = result.handoffs[size_t(q.id)];
      one["handoff"] = {{"prefill_replica", h.prefill}, {"decode_replica", h.decode}, {"kv_bytes", h.bytes},
                        {"ready_s", h.ready_s}, {"start_s", h.start_s}, {"arrive_s", h.arrive_s},
                        {"transfer_s", h.transfer_s}};
    }
    if (prompts) {  // the tokens in, and out
      one["prompt_tokens"] = (*prompts)[size_t(q.id)].prompt;
      one["tokens"] = q.tokens;
    }
    out.push_back(std::move(one));
  }
  return out;
}

nlohmann::json usage_json(const ServeResult& result) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < result.replicas.size(); ++i)
    for (const UsageSample& u : result.replicas[i].usage)
      out.push_back({{"replica", i}, {"t", u.t}, {"step_s", u.step_s}, {"used_blocks", u.used_blocks},
                     {"running", u.running}, {"waiting", u.waiting}, {"batch_tokens", u.batch_tokens}});
  return out;
}

}  // namespace shardlab::serve
