#include <algorithm>
#include <limits>
#include <memory>

#include "model/serve/engine_scheduler.h"
#include "model/serve/scheduler.h"
#include "runtime/errors.h"

namespace shardlab::serve {

using detail::check_fits;
using detail::EngineScheduler;

// V virtual engines share the replica's devices: each request goes to the
// engine with the fewest unfinished (ties: the lowest) when it arrives, as
// vLLM's pipeline-parallel scheduler picks, each engine has 1/V of the KV
// blocks, and the engine whose next step is ready first runs it (ties: the
// lowest), so the device threads take the steps in virtual-time order of
// their start. An engine's count is as of its last step's end.
struct ReplicaScheduler::Impl {
  SchedulerOptions each;
  StepExecutor& executor;
  int replica;
  std::vector<std::unique_ptr<EngineScheduler>> engines;
  std::vector<UsageSample> usage;  // the replica's: every engine's blocks and sequences
  EngineScheduler* next() const {
    EngineScheduler* ready = nullptr;
    for (const auto& e : engines)
      if (!e->finished() && (!ready || e->ready() < ready->ready())) ready = e.get();
    return ready;
  }
};

ReplicaScheduler::ReplicaScheduler(const SchedulerOptions& o, StepExecutor& executor, int replica)
    : impl_(std::make_unique<Impl>(Impl{o, executor, replica, {}, {}})) {
  SHARDLAB_CHECK(o.max_seqs > 0 && o.max_batch_tokens > 0 && o.chunked_prefill >= 0,
                 "scheduler limits must be positive");
  if (o.batching == Batching::kStatic && o.chunked_prefill > 0)
    throw ConfigError("`chunked_prefill` needs `batching` continuous");
  if (o.batching == Batching::kStatic && o.prefix_caching)
    throw ConfigError("`prefix_caching` needs `batching` continuous");
  if (o.batching == Batching::kStatic && o.speculative > 0)
    throw ConfigError("`speculative` needs `batching` continuous");
  SHARDLAB_CHECK(o.virtual_engines > 0, "a replica needs a virtual engine");
  const int V = o.virtual_engines;
  impl_->each.kv_blocks = o.kv_blocks / V;
  for (int v = 0; v < V; ++v) impl_->engines.push_back(std::make_unique<EngineScheduler>(impl_->each, executor, v, V));
}

ReplicaScheduler::~ReplicaScheduler() = default;

void ReplicaScheduler::check(const Request& r) const { check_fits(r, impl_->each); }

void ReplicaScheduler::add(const Request& r) {
  EngineScheduler* least = impl_->engines[0].get();
  for (const auto& e : impl_->engines)
    if (e->unfinished() < least->unfinished()) least = e.get();
  least->add(r);
}

bool ReplicaScheduler::finished() const { return impl_->next() == nullptr; }

double ReplicaScheduler::ready() const {
  const EngineScheduler* e = impl_->next();
  return e ? e->ready() : std::numeric_limits<double>::infinity();
}

int ReplicaScheduler::unfinished() const {
  int n = 0;
  for (const auto& e : impl_->engines) n += e->unfinished();
  return n;
}

int64_t ReplicaScheduler::cached_prefix_tokens(const Request& r) const {
  if (!impl_->each.prefix_caching) return 0;
  const std::vector<uint64_t> hashes = block_hashes(content_keys(r), impl_->each.kv_block);
  int64_t most = 0;
  for (const auto& e : impl_->engines)
    most = std::max(most, e->kv().cached_prefix(hashes) * impl_->each.kv_block);
  return most;
}

void ReplicaScheduler::step() {
  EngineScheduler* e = impl_->next();
  SHARDLAB_CHECK(e != nullptr, "a finished replica has no step to run");
  e->step(impl_->replica);
  if (impl_->engines.size() == 1) return;
  UsageSample u = e->usage_back();
  u.used_blocks = u.running = u.waiting = 0;
  for (const auto& x : impl_->engines) {
    u.used_blocks += x->kv().used_blocks();
    u.running += x->running();
    u.waiting += x->queued();
  }
  impl_->usage.push_back(u);
}

ReplicaResult ReplicaScheduler::result() {
  ReplicaResult out;
  for (auto& e : impl_->engines) {
    ReplicaResult r = e->result(impl_->replica);
    out.requests.insert(out.requests.end(), r.requests.begin(), r.requests.end());
    if (impl_->engines.size() == 1) out.usage = std::move(r.usage);
    out += r;
  }
  if (impl_->engines.size() > 1) out.usage = std::move(impl_->usage);
  std::sort(out.requests.begin(), out.requests.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

ReplicaResult simulate_replica(const std::vector<Request>& requests, const SchedulerOptions& o,
                               StepExecutor& executor, int replica) {
  ReplicaScheduler r(o, executor, replica);
  for (const Request& q : requests) r.check(q);  // every request fits before the first step
  for (size_t next = 0; next < requests.size() || !r.finished();) {
    if (next < requests.size() && requests[next].arrival_s <= r.ready()) {
      r.add(requests[next++]);
      continue;
    }
    r.step();
  }
  return r.result();
}

}  // namespace shardlab::serve
