#include "model/serve/serving.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/parse_number.h"
#include "runtime/text.h"

namespace shardlab::serve {

Routing parse_routing(const std::string& text) {
  if (text == "round-robin") return Routing::kRoundRobin;
  if (text == "least-loaded") return Routing::kLeastLoaded;
  if (text == "prefix") return Routing::kPrefix;
  throw ConfigError(fmt::format("`router` {}: expected round-robin, least-loaded or prefix", text));
}

const char* routing_name(Routing r) {
  return r == Routing::kRoundRobin ? "round-robin" : r == Routing::kLeastLoaded ? "least-loaded" : "prefix";
}

Disaggregation parse_disaggregate(const std::string& text) {
  const std::string usage = fmt::format("`disaggregate` {}: expected prefill=N,decode=M (N, M at least 1)", text);
  Disaggregation d;
  for (const std::string_view part : split(text, ',')) {
    const size_t eq = part.find('=');
    const std::string_view key = part.substr(0, eq);
    int* slot = key == "prefill" ? &d.prefill : key == "decode" ? &d.decode : nullptr;
    const std::optional<int> n = eq == std::string_view::npos ? std::nullopt : parse_number<int>(part.substr(eq + 1));
    if (!slot || *slot != 0 || !n || *n < 1 || *n > (1 << 20)) throw ConfigError(usage);
    *slot = *n;
  }
  if (d.prefill == 0 || d.decode == 0) throw ConfigError(usage);
  return d;
}

namespace {

// When request q dispatched to a replica (its index among `executors`)
// reaches it; null: when it is dispatched.
using Transit = std::function<double(const Request& q, int replica)>;

// Runs replicas first, first + 1, ... (one per executor, or as many as
// `count` sharing one) over `requests` in dispatch order (arrival_s).
std::vector<ReplicaResult> run_replicas(const std::vector<Request>& requests, const SchedulerOptions& o, Routing router,
                                        std::span<StepExecutor* const> executors, int count, int first,
                                        const Transit& transit) {
  auto executor = [&](int r) -> StepExecutor& { return *executors[executors.size() == 1 ? 0 : size_t(r)]; };
  std::vector<std::unique_ptr<ReplicaScheduler>> reps;
  for (int r = 0; r < count; ++r) reps.push_back(std::make_unique<ReplicaScheduler>(o, executor(r), first + r));
  for (const Request& q : requests) reps[0]->check(q);  // every request fits before the first step
  std::vector<ReplicaResult> out;
  if (router == Routing::kRoundRobin) {  // dealt ahead: each replica runs alone, one after another
    std::vector<std::vector<Request>> share(static_cast<size_t>(count));
    for (size_t i = 0; i < requests.size(); ++i) {
      Request q = requests[i];
      if (transit) q.arrival_s = transit(q, int(i % size_t(count)));
      share[i % size_t(count)].push_back(q);
    }
    for (int r = 0; r < count; ++r) {
      std::stable_sort(share[size_t(r)].begin(), share[size_t(r)].end(),
                       [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
      ReplicaScheduler& rep = *reps[size_t(r)];
      for (size_t next = 0; next < share[size_t(r)].size() || !rep.finished();) {
        if (next < share[size_t(r)].size() && share[size_t(r)][next].arrival_s <= rep.ready())
          rep.add(share[size_t(r)][next++]);
        else
          rep.step();
      }
      executor(r).drain();
      out.push_back(rep.result());
    }
    return out;
  }
  // Side by side: the next event is a dispatch, an arrival from the network
  // or the step that starts first (in that order at equal times).
  std::multimap<std::pair<double, size_t>, std::pair<int, Request>> inflight;  // by arrival, then dispatch
  std::vector<int> pending(size_t(count), 0);                                   // in flight to each replica
  auto least = [&](const std::vector<int>& among) {
    int best = among[0];
    for (const int r : among)
      if (reps[size_t(r)]->unfinished() + pending[size_t(r)] < reps[size_t(best)]->unfinished() + pending[size_t(best)])
        best = r;
    return best;
  };
  std::vector<int> all(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) all[size_t(r)] = r;
  auto route = [&](const Request& q) {
    if (router == Routing::kPrefix) {
      std::vector<int> longest;
      int64_t most = 0;
      for (int r = 0; r < count; ++r) {
        const int64_t hit = reps[size_t(r)]->cached_prefix_tokens(q);
        if (hit > most) longest.clear(), most = hit;
        if (hit == most && hit > 0) longest.push_back(r);
      }
      if (!longest.empty()) return least(longest);
    }
    return least(all);
  };
  const double never = std::numeric_limits<double>::infinity();
  for (size_t next = 0;;) {
    ReplicaScheduler* ready = nullptr;
    for (const auto& r : reps)
      if (!r->finished() && (!ready || r->ready() < ready->ready())) ready = r.get();
    const double step_at = ready ? ready->ready() : never;
    const double dispatch_at = next < requests.size() ? requests[next].arrival_s : never;
    const double arrive_at = inflight.empty() ? never : inflight.begin()->first.first;
    if (dispatch_at <= step_at && dispatch_at <= arrive_at && next < requests.size()) {
      const Request& q = requests[next];
      const int r = route(q);
      Request at = q;
      if (transit) at.arrival_s = transit(q, r);
      ++pending[size_t(r)];
      inflight.emplace(std::pair{at.arrival_s, next++}, std::pair{r, at});
    } else if (arrive_at <= step_at && !inflight.empty()) {
      auto [r, q] = inflight.begin()->second;
      inflight.erase(inflight.begin());
      --pending[size_t(r)];
      reps[size_t(r)]->add(q);
    } else if (ready) {
      ready->step();
    } else {
      break;
    }
  }
  for (int r = 0; r < count; ++r) {
    executor(r).drain();
    out.push_back(reps[size_t(r)]->result());
  }
  return out;
}

// Every replica's records in one, in id order, with their steps and counts.
ReplicaResult merged(const std::vector<ReplicaResult>& replicas, std::vector<RequestRecord> requests) {
  ReplicaResult all;
  for (const ReplicaResult& r : replicas) {
    all.usage.insert(all.usage.end(), r.usage.begin(), r.usage.end());
    all += r;
  }
  std::sort(requests.begin(), requests.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  all.requests = std::move(requests);
  return all;
}

ServeResult disaggregated(const std::vector<Request>& requests, const ServeOptions& o,
                          std::span<StepExecutor* const> executors, KvTransfer& transfer) {
  const Disaggregation& d = o.disaggregate;
  if (o.scheduler.batching == Batching::kStatic) throw ConfigError("`disaggregate` needs `batching` continuous");
  if (o.scheduler.speculative > 0)
    throw ConfigError("`disaggregate` with `speculative`: the draft's K and V are not handed over (not built)");
  auto part = [&](int first, int n) {
    return executors.size() == 1 ? executors : executors.subspan(size_t(first), size_t(n));
  };
  // Prefill: each request to its first token, its K and V handed on.
  std::vector<Request> prefills = requests;
  for (Request& q : prefills) {
    q.output_len = 1;
    q.hand_off = true;
  }
  ServeResult out;
  out.replicas = run_replicas(prefills, o.scheduler, o.router, part(0, d.prefill), d.prefill, 0, nullptr);
  std::vector<const RequestRecord*> prefilled(requests.size());
  for (const ReplicaResult& r : out.replicas)
    for (const RequestRecord& q : r.requests) prefilled[size_t(q.id)] = &q;
  // Decode: dispatched when the prefill ends (ties: by id), arriving with the transfer.
  std::vector<Request> decodes;
  for (const Request& q : requests) {
    if (q.output_len == 1) continue;
    Request h = q;
    h.arrival_s = prefilled[size_t(q.id)]->finish_s;
    h.handed = true;
    if (!prefilled[size_t(q.id)]->tokens.empty()) h.first = prefilled[size_t(q.id)]->tokens[0];
    decodes.push_back(std::move(h));
  }
  std::stable_sort(decodes.begin(), decodes.end(), [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
  out.handoffs.resize(requests.size());
  const Transit transit = [&](const Request& q, int replica) {
    Handoff& h = out.handoffs[size_t(q.id)] =
        transfer.send(prefilled[size_t(q.id)]->replica, replica, q.prompt_len, q.arrival_s);
    return h.arrive_s;
  };
  SchedulerOptions decoding = o.scheduler;
  decoding.prefix_caching = false;  // its requests come with their whole prompt's K and V
  const Routing router = o.router == Routing::kPrefix ? Routing::kLeastLoaded : o.router;
  std::vector<ReplicaResult> decoded =
      run_replicas(decodes, decoding, router, part(d.prefill, d.decode), d.decode, d.prefill, transit);
  // Every request's record: the prefill's, with the decode's end, tokens and preemptions.
  std::vector<RequestRecord> records;
  for (const RequestRecord* q : prefilled) records.push_back(*q);
  std::vector<double> prefill_ttft, transfer_s, wait_s;
  for (const RequestRecord* q : prefilled) prefill_ttft.push_back(q->first_token_s - q->arrival_s);
  for (const ReplicaResult& r : decoded)
    for (const RequestRecord& q : r.requests) {
      RequestRecord& m = records[size_t(q.id)];
      const Handoff& h = out.handoffs[size_t(q.id)];
      m.first_token_s = h.arrive_s;
      m.finish_s = q.finish_s;
      m.replica = q.replica;
      m.output_len = q.output_len;
      m.preemptions += q.preemptions;
      if (!q.tokens.empty()) m.tokens = q.tokens;  // the first token, then the decode's
      transfer_s.push_back(h.transfer_s);
      wait_s.push_back(h.start_s - h.ready_s);
      out.phases.kv_bytes += h.bytes;
      ++out.phases.transfers;
    }
  out.phases.prefill_ttft_s = percentiles(prefill_ttft);
  out.phases.transfer_s = percentiles(transfer_s);
  out.phases.handoff_wait_s = percentiles(wait_s);
  out.replicas.insert(out.replicas.end(), decoded.begin(), decoded.end());
  out.summary = summarize({merged(out.replicas, records)}, o.scheduler.kv_blocks, o.scheduler.kv_block);
  out.requests = std::move(records);
  return out;
}

}  // namespace

ServeResult simulate_serving(const std::vector<Request>& requests, const ServeOptions& o,
                             std::span<StepExecutor* const> executors, KvTransfer* transfer) {
  const int replicas = o.disaggregate.on() ? o.disaggregate.prefill + o.disaggregate.decode : o.replicas;
  SHARDLAB_CHECK(replicas > 0, "serving needs at least one replica");
  SHARDLAB_CHECK(executors.size() == 1 || executors.size() == size_t(replicas),
                 "serving needs an executor per replica, or one for all");
  if (o.router == Routing::kPrefix && !o.scheduler.prefix_caching)
    throw ConfigError("`router` prefix routes by the prefix cache: it needs `prefix_caching`");
  if (o.disaggregate.on()) {
    SHARDLAB_CHECK(transfer != nullptr, "disaggregated serving needs the KV cache's links");
    return disaggregated(requests, o, executors, *transfer);
  }
  ServeResult out;
  out.replicas = run_replicas(requests, o.scheduler, o.router, executors, replicas, 0, nullptr);
  std::vector<RequestRecord> records;
  for (const ReplicaResult& r : out.replicas) records.insert(records.end(), r.requests.begin(), r.requests.end());
  std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  out.requests = std::move(records);
  out.summary = summarize(out.replicas, o.scheduler.kv_blocks, o.scheduler.kv_block);
  return out;
}

int64_t kv_blocks_on_device(double capacity_bytes, double fraction, double weight_bytes,
                            double activation_bytes, double kv_bytes_per_token, int block) {
  SHARDLAB_CHECK(kv_bytes_per_token > 0 && block > 0, "KV bytes per token and block must be positive");
  const double room = capacity_bytes * fraction - weight_bytes - activation_bytes;
  if (!(room > 0)) return 0;
  return static_cast<int64_t>(std::min(std::floor(room / (kv_bytes_per_token * block)), double(kMaxKvBlocks)));
}

}  // namespace shardlab::serve
