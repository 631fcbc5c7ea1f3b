#include "runtime/cluster.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "runtime/cancel.h"
#include "runtime/cluster_share.h"
#include "runtime/errors.h"
#include "runtime/fiber.h"
#include "runtime/host_cores.h"
#include "runtime/log.h"
#include "runtime/transport.h"
#include "runtime/units.h"

#include <spdlog/spdlog.h>

namespace shardlab {

Time RunResult::makespan() const {
  Time t = 0;
  for (const auto& d : devices) t = std::max(t, d.end());
  return t;
}

Cluster::Cluster(HardwareProfile profile, ClusterOptions options)
    : profile_(std::move(profile)), options_(options) {
  if (options_.world_size == 0) options_.world_size = profile_.total_devices();
  if (options_.world_size < 1 || options_.world_size > profile_.total_devices()) {
    throw ConfigError(fmt::format("{} devices requested but profile {} has {} ({} node{} x {})",
                                  options_.world_size, profile_.name, profile_.total_devices(),
                                  profile_.nodes, profile_.nodes == 1 ? "" : "s", profile_.devices_per_node));
  }
  if (options_.host_threads < 0)
    throw ConfigError(fmt::format("ClusterOptions::host_threads {}: 0 (a thread per device) or more", options_.host_threads));
  (void)CostModel(profile_.device, options_.precision);  // refuses fp8 on a device without an FP8 peak
  if (!options_.links) {
    default_links_ = std::make_unique<ProfileLinkModel>(profile_);
    options_.links = default_links_.get();
  }
  links_ = options_.links;
  if (options_.faults) {
    (void)FaultPlan(options_.faults->faults(), options_.world_size);  // devices within this cluster
    const uint64_t normal = options_.memory_bytes ? options_.memory_bytes : profile_.memory_bytes();
    for (const Fault& f : options_.faults->faults())
      if (f.kind == FaultKind::kMemory && f.capacity_bytes > normal)
        throw ConfigError(fmt::format("`faults` {}: {} is more than the device's capacity {} (memory faults reduce it)",
                                      f.spec, format_bytes(f.capacity_bytes), format_bytes(normal)));
    fault_links_ = std::make_unique<FaultLinkModel>(*options_.links, options_.faults);
    links_ = fault_links_.get();
  }
}

Transport* Cluster::transport() const { return options_.single_process ? nullptr : process_transport(); }

namespace {

// The first failure of a run, from any thread.
class FirstError {
 public:
  // True for the run's first failure.
  bool set(int rank, std::exception_ptr e) {
    std::lock_guard lock(mu_);
    if (error_) return false;
    error_ = e;
    rank_ = rank;
    return true;
  }
  bool has() const {
    std::lock_guard lock(mu_);
    return error_ != nullptr;
  }
  [[noreturn]] void rethrow() const {
    std::lock_guard lock(mu_);
    try {
      std::rethrow_exception(error_);
    } catch (const RunError&) {
      throw;
    } catch (const Cancelled&) {
      throw;
    } catch (const ConfigError& e) {
      throw RunError(rank_, with_rank(e.what()), RunCause::kInput);
    } catch (const OutOfMemory& e) {
      throw RunError(rank_, with_rank(e.what()), RunCause::kInput);
    } catch (const DeviceFailure& e) {
      throw RunError(rank_, e.what(), RunCause::kDeviceFailure);
    } catch (const FoldingError& e) {
      throw RunError(rank_, with_rank(e.what()), RunCause::kFolding);
    } catch (const std::bad_alloc&) {  // the run's host buffers (its input's sizes) exceed the host
      throw RunError(rank_, with_rank(kHostOutOfMemory), RunCause::kInput);
    } catch (const std::exception& e) {
      throw RunError(rank_, with_rank(e.what()));
    } catch (...) {
      throw RunError(rank_, fmt::format("device {}: unknown exception", rank_));
    }
  }

 private:
  std::string with_rank(const std::string& what) const {
    const std::string prefix = fmt::format("device {}: ", rank_);
    return what.starts_with(prefix) ? what : prefix + what;
  }
  mutable std::mutex mu_;
  std::exception_ptr error_;  // GUARDED_BY(mu_)
  int rank_ = -1;             // GUARDED_BY(mu_)
};

}  // namespace

namespace {

// The record of one device after its program returned.
DeviceStats stats_of(Device& d) {
  DeviceStats s;
  s.rank = d.rank();
  s.node = d.node();
  s.compute_end = d.compute().now();
  s.comm_end = d.comm().now();
  s.compute_busy = d.compute().busy();
  s.comm_busy = d.comm().busy();
  s.comm_exposed = s.comm_busy - overlap(d.compute().intervals(), d.comm().intervals());
  s.compute_transfer = d.compute().transfer_busy();
  s.compute_flops = d.compute().flops();
  s.peak_bytes = d.arena().peak();
  s.capacity_bytes = d.arena().capacity();
  for (int k = 0; k < kNumMemKinds; ++k) s.peak_by_kind[k] = d.arena().peak(static_cast<MemKind>(k));
  return s;
}


// Watchdog: polls for a global deadlock until every device has returned.
// `running` is guarded by done_mu.
// Across processes the transport runs the waits-for check instead (`local`
// false): one process's devices all blocked is no deadlock of the run.
template <typename Period>
void watch(Fabric& fabric, FirstError& error, std::mutex& done_mu, std::condition_variable& done_cv,
           const int& running, Period period, bool local) {
  std::unique_lock lock(done_mu);
  while (running > 0) {
    if (done_cv.wait_for(lock, period, [&] { return running == 0; })) break;
    lock.unlock();
    if (cancel_requested() && !fabric.aborted()) {  // runtime/cancel.h
      error.set(-1, std::make_exception_ptr(Cancelled()));
      fabric.abort();
    }
    if (local && !fabric.aborted()) {
      if (auto what = fabric.find_deadlock()) {
        spdlog::debug("watchdog: {}", *what);
        error.set(-1, std::make_exception_ptr(RunError(-1, *what, RunCause::kDeadlock)));
        fabric.abort();
      }
    }
    lock.lock();
  }
}

}  // namespace

// The devices this process runs (folded ranks are marked finished instead).
std::vector<std::unique_ptr<Device>> Cluster::make_devices(Fabric& fabric, const std::function<bool(int)>& local,
                                                           std::chrono::steady_clock::time_point wall_start,
                                                           int& running) const {
  const int n = options_.world_size;
  const std::vector<int>& rep = options_.representative;
  std::vector<std::unique_ptr<Device>> devices(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (!rep.empty() && rep[size_t(r)] != r) {  // folded: played by its representative, never a thread
      fabric.mark_finished(r);
      continue;
    }
    if (!local(r)) continue;
    DeviceConfig cfg{r, n, options_.memory_bytes, options_.precision, options_.pace, options_.trace,
                     rep.empty() ? nullptr : &rep, options_.faults.get()};
    cfg.rendezvous = options_.rendezvous && !transport() && links_ == default_links_.get() && !options_.hooks &&
                     !options_.faults;
    if (cfg.faults) cfg.memory_bytes = cfg.faults->capacity(r, cfg.memory_bytes ? cfg.memory_bytes : profile_.memory_bytes());
    devices[size_t(r)] = std::make_unique<Device>(cfg, profile_, *links_, fabric,
                                                  options_.hooks, device_logger(r), wall_start);
    ++running;
  }
  return devices;
}

RunResult Cluster::run(const Program& program) {
  if (cancel_requested()) throw Cancelled();  // runtime/cancel.h
  const int n = options_.world_size;
  const auto wall_start = std::chrono::steady_clock::now();
  Fabric fabric(n);
  SHARDLAB_CHECK(options_.representative.empty() || options_.representative.size() == size_t(n),
                 "one representative per rank");
  // Across processes (transport.h) this process runs only its block of devices.
  Transport* transport = this->transport();
  const std::vector<int> owners = transport ? device_owners(n, transport->processes(), profile_) : std::vector<int>{};
  const std::function<bool(int)> local = [&](int r) { return !transport || owners[size_t(r)] == transport->process(); };
  int running = 0;  // GUARDED_BY(done_mu) once the threads start
  std::vector<std::unique_ptr<Device>> devices = make_devices(fabric, local, wall_start, running);

  FirstError error;
  std::mutex done_mu;
  std::condition_variable done_cv;
  if (transport) {
    auto on_abort = [&](const RunFailure* f) {
      if (f) error.set(f->rank, std::make_exception_ptr(RunError(f->rank, f->what, f->cause)));
      fabric.abort();
    };
    transport->begin_run(fabric, owners, {on_abort, options_.watchdog_period});
  }

  auto body = [&](int r) {
    Device& dev = *devices[static_cast<size_t>(r)];
    try {
      dev.log().debug("started on node {}", dev.node());
      program(dev);
      dev.log().debug("finished at virtual {:.3f} us, peak memory {} bytes", to_us(dev.now()), dev.arena().peak());
    } catch (const Aborted&) {
      // Torn down because of another device's failure.
    } catch (...) {
      const bool first = error.set(r, std::current_exception());
      fabric.abort();
      if (first && transport) transport->abort_others();
    }
    fabric.mark_finished(r);
    std::lock_guard lock(done_mu);
    if (--running == 0) done_cv.notify_all();
  };

  // A lone device's GEMMs may borrow the idle cores: each host thread counts.
  std::vector<std::thread> threads;
  const int devices_here = running;  // no thread runs yet
  const int hosts = transport || options_.pace > 0 ? 0 : std::min(options_.host_threads, devices_here);
  std::vector<FiberHost> fibers(static_cast<size_t>(hosts));
  if (hosts == 0) {
    threads.reserve(static_cast<size_t>(devices_here));
    for (int r = 0; r < n; ++r)
      if (devices[size_t(r)]) threads.emplace_back([&body, r] {
          const DeviceThreadCount counted;
          body(r);
        });
  } else {
    for (int r = 0, i = 0; r < n; ++r) {  // the i-th running device: host i * hosts / devices_here
      if (!devices[size_t(r)]) continue;
      Fiber& f = fibers[size_t(i++ * hosts / devices_here)].add([&body, r] { body(r); });
      fabric.bind_fiber(r, &f);
    }
    for (FiberHost& h : fibers) threads.emplace_back([&h] {
        const DeviceThreadCount counted;
        h.run();
      });
  }
  watch(fabric, error, done_mu, done_cv, running, options_.watchdog_period, /*local=*/!transport);
  for (auto& t : threads) t.join();
  if (transport) {
    transport->end_run();
    agree_on_failure(*transport, error.has() ? failure_of([&] { error.rethrow(); }) : std::nullopt);
  } else if (error.has()) {
    error.rethrow();
  }
  return collect(devices, wall_start);
}

// Every rank's record, in rank order; across processes, every process's.
RunResult Cluster::collect(std::vector<std::unique_ptr<Device>>& devices,
                           std::chrono::steady_clock::time_point wall_start) const {
  const int n = options_.world_size;
  const std::vector<int>& rep = options_.representative;
  std::vector<std::optional<DeviceStats>> stats(static_cast<size_t>(n));
  std::vector<DeviceTrace> traces;
  for (int r = 0; r < n; ++r) {
    if (const auto& d = devices[size_t(r)]) {
      stats[size_t(r)] = stats_of(*d);
      if (options_.trace) traces.push_back({d->rank(), d->node(), std::move(d->trace_events())});
    }
  }
  if (Transport* t = transport()) share_records(*t, stats, traces);
  RunResult result;
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  for (int r = 0; r < n; ++r) {
    if (!stats[size_t(r)]) {  // folded: its representative's record
      DeviceStats s = *stats[size_t(rep[size_t(r)])];
      s.rank = r;
      s.node = profile_.node_of(r);
      result.devices.push_back(s);
      continue;
    }
    result.devices.push_back(*stats[size_t(r)]);
  }
  result.traces = std::move(traces);
  return result;
}

}  // namespace shardlab
