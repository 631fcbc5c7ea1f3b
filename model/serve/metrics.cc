#include "model/serve/metrics.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

namespace shardlab::serve {

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double rank = q / 100.0 * double(v.size() - 1);
    const auto lo = static_cast<size_t>(rank);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (rank - double(lo)) * (v[hi] - v[lo]);
  };
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  p.p50 = at(50);
  p.p90 = at(90);
  p.p99 = at(99);
  p.max = v.back();
  return p;
}

ServeSummary summarize(const std::vector<ReplicaResult>& replicas, int64_t kv_blocks, int kv_block) {
  ServeSummary s;
  std::vector<double> ttft, tpot, e2e;
  double first = 0, last = 0, busy = 0, weighted = 0;
  bool any = false;
  int64_t out_tokens = 0, all_tokens = 0;
  for (const ReplicaResult& r : replicas) {
    for (const RequestRecord& q : r.requests) {
      first = any ? std::min(first, q.arrival_s) : q.arrival_s;
      last = any ? std::max(last, q.finish_s) : q.finish_s;
      any = true;
      ttft.push_back(q.first_token_s - q.arrival_s);
      e2e.push_back(q.finish_s - q.arrival_s);
      if (q.output_len > 1) tpot.push_back((q.finish_s - q.first_token_s) / (q.output_len - 1));
      out_tokens += q.output_len;
      all_tokens += q.prompt_len + q.output_len;
    }
    for (const UsageSample& u : r.usage) {
      const double use = kv_blocks > 0 ? double(u.used_blocks) / double(kv_blocks) : 0;
      s.kv_peak_use = std::max(s.kv_peak_use, use);
      busy += u.step_s;
      weighted += use * u.step_s;
    }
    s += r;
  }
  if (s.drafts_proposed > 0) s.draft_acceptance = double(s.drafts_accepted) / double(s.drafts_proposed);
  if (s.prefix_query_tokens > 0) s.prefix_hit_rate = double(s.prefix_hit_tokens) / double(s.prefix_query_tokens);
  if (busy > 0) s.kv_mean_use = weighted / busy;
  s.requests = static_cast<int64_t>(ttft.size());
  s.ttft_s = percentiles(ttft);
  s.tpot_s = percentiles(tpot);
  s.e2e_s = percentiles(e2e);
  s.makespan_s = last - first;
  if (s.makespan_s > 0) {
    s.requests_per_s = double(s.requests) / s.makespan_s;
    s.output_tokens_per_s = double(out_tokens) / s.makespan_s;
    s.total_tokens_per_s = double(all_tokens) / s.makespan_s;
  }
  s.kv_capacity_tokens = kv_blocks * kv_block;
  return s;
}

nlohmann::json percentiles_json(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max}};
}

nlohmann::json summary_json(const ServeSummary& s) {
  return {{"requests", s.requests},
          {"ttft_s", percentiles_json(s.ttft_s)},
          {"tpot_s", percentiles_json(s.tpot_s)},
          {"e2e_s", percentiles_json(s.e2e_s)},
          {"makespan_s", s.makespan_s},
          {"requests_per_s", s.requests_per_s},
          {"output_tokens_per_s", s.output_tokens_per_s},
          {"total_tokens_per_s", s.total_tokens_per_s},
          {"kv_capacity_tokens_per_replica", s.kv_capacity_tokens},
          {"kv_peak_use", s.kv_peak_use},
          {"kv_mean_use", s.kv_mean_use},
          {"preemptions", s.preemptions},
          {"steps", s.steps},
          {"prefix_cache", {{"query_tokens", s.prefix_query_tokens},
                            {"hit_tokens", s.prefix_hit_tokens},
                            {"hit_rate", s.prefix_hit_rate}}},
          {"speculative", {{"drafts_proposed", s.drafts_proposed},
                           {"drafts_accepted", s.drafts_accepted},
                           {"acceptance", s.draft_acceptance}}}};
}

}  // namespace shardlab::serve
