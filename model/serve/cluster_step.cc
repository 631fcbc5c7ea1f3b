#include "model/serve/cluster_step.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "collectives/mesh.h"
#include "model/buffer.h"
#include "model/infer/infer_device.h"
#include "model/parallel/parallel_context.h"
#include "model/serve/replica_device.h"
#include "model/serve/serving.h"
#include "runtime/errors.h"
#include "runtime/host_cores.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace shardlab::serve {


using detail::CacheOp;
using detail::DeviceStep;
using detail::ReplicaDevice;

// Where the scheduler's thread and the device threads meet: the scheduler
// posts a job (releases, then a batch) and waits until every device has run
// it; a device that throws wakes everyone, and finish() rethrows.
struct ClusterStepExecutor::Mailbox {
  std::mutex m;
  // Devices wait for a job each on its own waiter (Device::park: a fiber
  // gives its host thread to the next device), the scheduler on `all_done`
  // for the last device to finish it: one shared variable woke every
  // device that had finished (and the scheduler) at each device's end,
  // about 40 needless wake-ups per step at tp 8, each a context switch on
  // a small host.
  std::vector<Device*> waiting;  // by rank: the devices in their job loop
  std::condition_variable all_done;
  int64_t job = 0;
  std::vector<int64_t> done;  // per device: the last job run
  bool stop = false, failed = false;
  std::vector<BatchEntry> batch;
  Time start = 0;
  std::vector<CacheOp> ops, pending;  // of the posted job; for the next one
  std::vector<DeviceStep> steps;
  std::thread runner;
  RunResult result;
  std::exception_ptr error;
  // Wakes every device in its job loop (under m).
  void wake_devices() {
    for (Device* d : waiting)
      if (d) d->unpark();
  }
  // Whether every device here has run `job` (under m).
  bool all_ran(int64_t job) const {
    return std::all_of(done.begin(), done.end(), [&](int64_t d) { return d == job || d < 0; });
  }
};

ClusterStepExecutor::ClusterStepExecutor(Cluster& cluster, ReplicaShape shape)
    : cluster_(cluster), shape_(std::move(shape)), plan_(shape_.model, shape_.tp, shape_.pp, shape_.ep, shape_.kv_fp8) {
  plan_.check_cluster(cluster, "a replica");
  if (const auto& sp = shape_.speculative) {
    if (shape_.pp > 1 || shape_.ep > 1) throw ConfigError("`speculative` runs the draft beside the target on tp only: no `pp` or `ep`");
    if (sp->draft.token_vocab() != shape_.model.token_vocab() || sp->draft.block_size < shape_.model.block_size)
      throw ConfigError(fmt::format("`speculative`: the draft model's vocabulary ({}) and context ({}) must be the "
                                    "target's ({}, at least {})", sp->draft.token_vocab(), sp->draft.block_size,
                                    shape_.model.token_vocab(), shape_.model.block_size));
    draft_plan_.emplace(sp->draft, shape_.tp, 1, 1);
  }
  if (Transport* t = process_transport()) owners_ = device_owners(shape_.world(), t->processes(), cluster.profile());
  if (!shape_.phantom || !shape_.fold) return;
  representative_ = plan_.fold_representatives(cluster.profile());
}

ClusterStepExecutor::~ClusterStepExecutor() {
  if (!box_) return;
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() was not called after a failure
  }
}

ReplicaPlan ClusterStepExecutor::plan(int64_t max_batch_tokens) {
  SHARDLAB_CHECK(!box_, "plan() runs before the first step");
  // The largest step: max_batch_tokens new tokens, in sequences of at most
  // the model's context (what vLLM's profiling run does).
  std::vector<BatchEntry> probe;
  for (int64_t left = max_batch_tokens; left > 0; left -= shape_.model.block_size)
    probe.push_back({int(probe.size()), int(std::min<int64_t>(left, shape_.model.block_size)), 0});
  ReplicaPlan p;
  p.kv_bytes_per_token.assign(size_t(shape_.world()), 0);
  prepare_run();
  const RunResult r = cluster_.run([&](Device& dev) {
    model::PhantomScope phantom(true);  // sizes only
    ReplicaDevice d(dev, plan_, draft_plan_ ? &*draft_plan_ : nullptr, shape_, false);
    d.step(probe, 0);
    p.kv_bytes_per_token[size_t(dev.rank())] = d.kv_bytes_per_token();
  });
  merge_disjoint(p.kv_bytes_per_token);  // under mpirun each process measured its own devices
  for (int rank = 0; rank < shape_.world(); ++rank)  // a folded rank holds what its representative does
    if (!runs(rank)) p.kv_bytes_per_token[size_t(rank)] = p.kv_bytes_per_token[size_t(representative_[size_t(rank)])];
  for (const DeviceStats& d : r.devices) {
    p.capacity_bytes.push_back(d.capacity_bytes);
    p.weight_bytes.push_back(d.peak_by_kind[int(MemKind::kParam)]);
    p.activation_bytes.push_back(d.peak_by_kind[int(MemKind::kActivation)]);
  }
  return p;
}

void ClusterStepExecutor::prepare_run() {
  cluster_.set_representatives(representative_);
  const int hosts = shape_.host_threads < 0 ? usable_host_cores() : shape_.host_threads;
  cluster_.set_host_threads(shape_.phantom ? 0 : hosts);
}

void ClusterStepExecutor::start() {
  box_ = std::make_unique<Mailbox>();
  Mailbox& b = *box_;
  b.done.assign(size_t(shape_.world()), 0);
  b.waiting.assign(size_t(shape_.world()), nullptr);
  b.steps.assign(size_t(shape_.world()), {});
  for (int rank = 0; rank < shape_.world(); ++rank)
    if (!runs(rank) || !here(rank)) b.done[size_t(rank)] = -1;  // no thread here: never waited for
  prepare_run();
  b.runner = std::thread([this, &b] {
    try {
      b.result = cluster_.run([this, &b](Device& dev) {
        model::PhantomScope phantom(shape_.phantom);
        ReplicaDevice d(dev, plan_, draft_plan_ ? &*draft_plan_ : nullptr, shape_, !shape_.phantom);
        // In the job loop: woken by the scheduler (until it leaves it).
        struct Waiting {
          Mailbox& b;
          Device& dev;
          Waiting(Mailbox& b, Device& dev) : b(b), dev(dev) { set(&dev); }
          ~Waiting() { set(nullptr); }
          void set(Device* d) {
            std::lock_guard<std::mutex> g(b.m);
            b.waiting[size_t(dev.rank())] = d;
          }
        } waiting(b, dev);
        for (int64_t seen = 0;;) {
          std::unique_lock<std::mutex> l(b.m);
          while (b.job <= seen && !b.stop && !b.failed) dev.park(l);
          if (b.stop || b.failed) return;
          seen = b.job;
          const std::vector<BatchEntry> batch = b.batch;
          const std::vector<CacheOp> ops = b.ops;
          const Time start = b.start;
          l.unlock();
          DeviceStep s;
          try {
            for (const CacheOp& op : ops) d.apply(op);
            if (!batch.empty()) s = d.step(batch, start);  // empty: the operations alone (drain)
          } catch (...) {
            std::lock_guard<std::mutex> g(b.m);
            b.failed = true;
            b.wake_devices();
            b.all_done.notify_all();
            throw;
          }
          std::lock_guard<std::mutex> g(b.m);
          b.steps[size_t(dev.rank())] = s;
          b.done[size_t(dev.rank())] = seen;
          if (b.all_ran(seen)) b.all_done.notify_all();
        }
      });
    } catch (...) {
      std::lock_guard<std::mutex> g(b.m);
      b.error = std::current_exception();
      b.failed = true;
      b.wake_devices();
      b.all_done.notify_all();
    }
  });
}

void ClusterStepExecutor::begin_step(int replica, double now_s) {
  const Time now = Time(std::llround(now_s * double(kPicosPerSecond)));
  if (replica != replica_) {  // the next replica's devices start afresh, at time 0
    finish();
    clock_ = 0;
  }
  replica_ = replica;
  // One engine: after the last step. Several: at the engine's own time (each
  // device then waits until it is free).
  start_ = shape_.virtual_engines > 1 ? now : std::max(clock_, now);
}

// Only the scheduler's thread touches `pending`.
void ClusterStepExecutor::release(int seq) {
  if (box_) box_->pending.push_back({CacheOp::Kind::kRelease, seq});
}

void ClusterStepExecutor::cache_block(int seq, int64_t first, int tokens, int32_t block) {
  if (box_) box_->pending.push_back({CacheOp::Kind::kCache, seq, first, tokens, block});
}

void ClusterStepExecutor::evict_block(int32_t block) {
  if (box_) box_->pending.push_back({CacheOp::Kind::kEvict, 0, 0, 0, block});
}

void ClusterStepExecutor::hand_off(int seq, int request) {
  if (box_) box_->pending.push_back({CacheOp::Kind::kHandOff, seq, 0, 0, request});
}

// Posts the pending operations and `batch` (empty: the operations alone)
// to the devices and waits until every one has run them; returns with the
// mailbox locked.
std::unique_lock<std::mutex> ClusterStepExecutor::post(std::span<const BatchEntry> batch) {
  Mailbox& b = *box_;
  std::unique_lock<std::mutex> l(b.m);
  b.batch.assign(batch.begin(), batch.end());
  b.start = start_;
  b.ops.swap(b.pending);
  b.pending.clear();
  const int64_t job = ++b.job;
  b.wake_devices();
  b.all_done.wait(l, [&] { return b.failed || b.all_ran(job); });
  if (b.failed) {
    l.unlock();
    finish();  // rethrows the device's error
    throw RunError(0, "serving: a device failed");
  }
  return l;
}

StepOutcome ClusterStepExecutor::run_step(std::span<const BatchEntry> batch) {
  if (!box_) start();
  Mailbox& b = *box_;
  std::unique_lock<std::mutex> l = post(batch);
  Time end = start_;
  for (const DeviceStep& d : b.steps) end = std::max(end, d.end);  // only this process's devices ran
  std::vector<model::Token> tokens;
  if (const int sampler = plan_.sampler; !shape_.phantom && here(sampler))
    for (float t : b.steps[size_t(sampler)].tokens) tokens.push_back(model::Token(t));
  std::vector<int> counts;  // speculating: every device that ran holds the same
  for (const DeviceStep& d : b.steps)
    if (counts.empty()) counts = d.counts;
  l.unlock();
  agree_on_step(end, tokens);
  StepOutcome out{to_seconds(end - start_), std::move(tokens), std::move(counts)};
  clock_ = end;
  start_ = end;
  return out;
}

bool ClusterStepExecutor::here(int rank) const {
  return owners_.empty() || owners_[size_t(rank)] == process_transport()->process();
}

void ClusterStepExecutor::agree_on_step(Time& end, std::vector<model::Token>& tokens) {
  Transport* t = process_transport();
  if (!t) return;
  wire::Writer w;
  w.put(end).put_vector(tokens);
  const std::optional<std::vector<std::string>> all = t->exchange_in_run(w.str());
  if (!all) {  // a device failed in another process (or the watchdog stopped the run)
    finish();  // rethrows the run's agreed failure
    throw RunError(0, "serving: a device failed");
  }
  for (const std::string& s : *all) {
    wire::Reader r(s);
    end = std::max(end, r.get<Time>());
    std::vector<model::Token> theirs = r.get_vector<model::Token>();
    if (!theirs.empty()) tokens = std::move(theirs);  // only the sampler rank's process has the tokens
  }
}

RunResult ClusterStepExecutor::finish() {
  if (!box_) return {};
  bool flush = !box_->pending.empty();  // the last step's operations (a hand-off's K and V)
  {
    std::lock_guard<std::mutex> g(box_->m);
    flush = flush && !box_->failed;
  }
  if (flush) post({});
  std::unique_ptr<Mailbox> b = std::move(box_);
  {
    std::lock_guard<std::mutex> g(b->m);
    b->stop = true;
    b->wake_devices();
  }
  b->runner.join();
  if (b->error) std::rethrow_exception(b->error);
  runs_.push_back(b->result);
  return std::move(b->result);
}

int64_t ReplicaPlan::kv_blocks(double kv_fraction, int block) const {
  int64_t blocks = -1;
  for (size_t d = 0; d < weight_bytes.size(); ++d) {
    const int64_t here = kv_blocks_on_device(double(capacity_bytes[d]), kv_fraction, double(weight_bytes[d]),
                                             double(activation_bytes[d]), kv_bytes_per_token[d], block);
    blocks = blocks < 0 ? here : std::min(blocks, here);
  }
  return std::max<int64_t>(blocks, 0);
}

}  // namespace shardlab::serve
