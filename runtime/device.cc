#include "runtime/device.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab {

// ---- Stream -----------------------------------------------------------------

void Stream::wait(Event e) {
  if (e.time > now_) {
    now_ = e.time;
    owner_->pace(now_);
  }
}

Time Stream::run(const char* name, Time duration, uint64_t bytes, double flops) {
  const Time start = now_;
  now_ += duration;
  flops_ += flops;
  add_busy(start, now_);
  owner_->record(kind_, name, start, now_, bytes, flops, -1);
  owner_->pace(now_);
  return now_;
}

void Stream::mark(const char* name, Time start, Time end, uint64_t bytes, int peer, bool advance) {
  if (end > start) {
    const Time before = busy_;
    add_busy(start, end);
    transfer_busy_ += busy_ - before;
    owner_->record(kind_, name, start, end, bytes, 0, peer);
  }
  if (advance && end > now_) {
    now_ = end;
    owner_->pace(now_);
  }
}

void Stream::add_busy(Time start, Time end) {
  if (end <= start) return;
  // Usually [start, end) begins at or after every interval so far. Not
  // always: a send is marked from its departure, which can wait for an
  // egress port another stream holds, and a receive posted on this stream
  // before that departure is marked from its posting. So merge exactly:
  // intervals_[i, j) are those the new one overlaps or touches.
  size_t j = intervals_.size();
  while (j > 0 && intervals_[j - 1].start > end) --j;
  size_t i = j;
  while (i > 0 && intervals_[i - 1].end >= start) --i;
  Interval merged{start, end};
  for (size_t k = i; k < j; ++k) {
    merged.start = std::min(merged.start, intervals_[k].start);
    merged.end = std::max(merged.end, intervals_[k].end);
    busy_ -= intervals_[k].end - intervals_[k].start;
  }
  busy_ += merged.end - merged.start;
  intervals_.erase(intervals_.begin() + static_cast<std::ptrdiff_t>(i), intervals_.begin() + static_cast<std::ptrdiff_t>(j));
  intervals_.insert(intervals_.begin() + static_cast<std::ptrdiff_t>(i), merged);
}

void Stream::restart(StreamKind kind, Time t) {
  kind_ = kind;
  now_ = t;
  busy_ = transfer_busy_ = 0;
  flops_ = 0;
  intervals_.clear();
}

void Stream::absorb(const Stream& other) {
  for (const Interval& i : other.intervals_) {
    const Time before = busy_;
    add_busy(i.start, i.end);
    transfer_busy_ += busy_ - before;
  }
}

Stream* Device::lanes(int n, StreamKind kind, Time t) {
  while (lanes_.size() < static_cast<size_t>(n)) lanes_.emplace_back(this, kind);
  for (int ch = 0; ch < n; ++ch) lanes_[static_cast<size_t>(ch)].restart(kind, t);
  return lanes_.data();
}

Time overlap(const std::vector<Stream::Interval>& a, const std::vector<Stream::Interval>& b) {
  Time total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const Time lo = std::max(a[i].start, b[j].start), hi = std::min(a[i].end, b[j].end);
    if (hi > lo) total += hi - lo;
    (a[i].end < b[j].end) ? ++i : ++j;
  }
  return total;
}

namespace {
[[noreturn]] void doubt_failure(int rank, const char* what, Time t, Time until) {
  throw FoldingError(fmt::format(
      "folding: device {} {} at {} ps while its folded peers' ports may still be busy until {} ps: "
      "not foldable exactly",
      rank, what, t, until));
}
}  // namespace

// ---- Device -----------------------------------------------------------------

Device::Device(const DeviceConfig& cfg, const HardwareProfile& profile, const LinkModel& links,
               Fabric& fabric, FabricHooks* hooks, std::shared_ptr<spdlog::logger> log,
               std::chrono::steady_clock::time_point wall_start)
    : cfg_(cfg),
      profile_(profile),
      links_(links),
      fabric_(fabric),
      hooks_(hooks),
      log_(std::move(log)),
      wall_start_(wall_start),
      cost_(profile.device, cfg.precision),
      arena_(cfg.rank, cfg.memory_bytes ? cfg.memory_bytes : profile.memory_bytes()),
      compute_(this, StreamKind::kCompute),
      comm_(this, StreamKind::kComm) {}

Time Device::now() const { return std::max(compute_.now(), comm_.now()); }

void Device::synchronize() {
  const Event e{now()};
  compute_.wait(e);
  comm_.wait(e);
}

Tensor Device::alloc(std::string name, Shape shape, MemKind kind, bool phantom) {
  return Tensor(arena_, std::move(name), std::move(shape), kind, cfg_.precision, phantom);
}

Time Device::run(Stream& s, const char* name, const OpCost& op) {
  check_abort();
  Time d = cost_.duration(op);
  // A straggler: every kernel F times as long, rounded up to a picosecond.
  if (const double f = cfg_.faults ? cfg_.faults->compute_scale(cfg_.rank, step_) : 1.0; f != 1.0)
    d = static_cast<Time>(std::ceil(static_cast<double>(d) * f));
  if (&s == &compute_ && !collectives_.empty()) d = compute_end(s.now(), d) - s.now();
  return s.run(name, d, static_cast<uint64_t>(op.bytes), op.flops);
}

void Device::note_collective(Time start, Time end, int blocks) {
  if (end > start && blocks > 0 && profile_.device.gemm.sm_count > 0) collectives_.push_back({start, end, blocks});
}

Time Device::compute_end(Time start, Time work) {
  const int64_t sms = profile_.device.gemm.sm_count;
  std::erase_if(collectives_, [start](const Busy& b) { return b.end <= start; });
  if (sms <= 0 || collectives_.empty() || work <= 0) return start + work;
  // Piecewise over the collectives' boundaries after `start`: between two
  // boundaries the free SMs are constant. Exact in integers (SM-picoseconds).
  std::vector<Time> cuts;
  for (const Busy& b : collectives_) {
    if (b.start > start) cuts.push_back(b.start);
    cuts.push_back(b.end);
  }
  std::sort(cuts.begin(), cuts.end());
  int64_t left = work * sms;  // SM-picoseconds still to run
  Time t = start;
  for (const Time cut : cuts) {
    if (cut <= t) continue;
    int64_t held = 0;
    for (const Busy& b : collectives_)
      if (b.start <= t && t < b.end) held += b.blocks;
    const int64_t free = sms - std::min(held, sms - 1);
    if (left <= (cut - t) * free) return t + (left + free - 1) / free;
    left -= (cut - t) * free;
    t = cut;
  }
  return t + (left + sms - 1) / sms;  // past every collective: full speed
}

void Device::check_fault(int peer, bool sending) const {
  const Fault* f = cfg_.faults ? cfg_.faults->fatal_for(cfg_.rank, peer, step_) : nullptr;
  if (!f) return;
  const bool dead = f->kind == FaultKind::kDead;
  const std::string transfer = fmt::format("{} {} device {}", dead ? "its" : fmt::format("device {}'s", cfg_.rank),
                                           sending ? "send to" : "receive from", peer);
  const std::string during =
      activity_.empty() ? "a point-to-point transfer (" + transfer + ")" : activity_ + " (" + transfer + ")";
  const std::string noticed = step_ == f->step ? "" : fmt::format(", noticed at step {}", step_);
  if (dead)
    throw DeviceFailure(fmt::format("device {} died at step {}{} during {}; resume from a checkpoint without it",
                                    cfg_.rank, f->step, noticed, during));
  throw DeviceFailure(
      fmt::format("link {}-{} went down at step {}{} during {}", f->device, f->peer, f->step, noticed, during));
}

// A peer out of the world, or the device itself, is the program's error (a
// device program of the C++ API can name any int): the run fails with a
// RunError naming it, as any exception on a device, instead of aborting the
// process that hosts the cluster (a notebook's kernel, a test binary).
void Device::check_peer(int peer, const char* what) const {
  if (peer >= 0 && peer < cfg_.world_size && peer != cfg_.rank) return;
  throw std::invalid_argument(fmt::format("{} peer {} invalid: {}", what, peer,
                                          peer == cfg_.rank ? "a device's own rank"
                                                            : fmt::format("outside the world of {}", cfg_.world_size)));
}

Message Device::book_send(Stream& s, int dst, Tag tag, uint64_t modeled_bytes, Engine engine, uint64_t rate_cap) {
  check_peer(dst, "send");
  check_abort();
  check_fault(dst, /*sending=*/true);
  if (hooks_) hooks_->on_send(cfg_.rank, dst, tag);
  Message m;
  m.src = cfg_.rank;
  m.dst = dst;
  m.tag = tag;
  m.link = links_.link_at(cfg_.rank, dst, step_);
  if (rate_cap > 0 && rate_cap < m.link.bytes_per_second) m.link.bytes_per_second = rate_cap;
  m.modeled_bytes = modeled_bytes;
  m.engine = engine;
  const int port = static_cast<int>(m.link.port);
  if (s.now() < egress_doubt_[port]) doubt_failure(cfg_.rank, "sends", s.now(), egress_doubt_[port]);
  const Port::Booking b = egress_[port].book(static_cast<int>(s.kind()), s.now(), m.wire_time());
  m.depart = b.start;
  m.sent = b.end;
  s.mark("send", m.depart, m.sent, modeled_bytes, dst, /*advance=*/false);
  return m;
}

SendHandle Device::isend(Stream& s, int dst, Tag tag, std::span<const std::byte> host,
                         uint64_t modeled_bytes, Engine engine, uint64_t rate_cap) {
  Message m = book_send(s, dst, tag, modeled_bytes, engine, rate_cap);
  const Time done = m.sent;
  m.payload = fabric_.pool().acquire(host.size());
  if (!host.empty()) std::memcpy(m.payload.data(), host.data(), host.size());
  fabric_.post(std::move(m));
  return {done};
}

SendHandle Device::isend_folded(Stream& s, int dst, Tag tag, uint64_t modeled_bytes,
                                std::span<const Delivery> deliveries) {
  const Message sent = book_send(s, dst, tag, modeled_bytes, Engine::kSm, 0);
  for (const Delivery& d : deliveries) {
    SHARDLAB_CHECK(d.as >= 0 && d.as < cfg_.world_size && representative(d.as) == cfg_.rank && d.to >= 0 &&
                       d.to < cfg_.world_size && !folded(d.to) && d.as != d.to,
                   fmt::format("device {}: folded send as {} to {}", cfg_.rank, d.as, d.to));
    Message m;
    m.src = d.as;
    m.dst = d.to;
    m.tag = tag;
    m.link = sent.link;
    m.modeled_bytes = modeled_bytes;
    m.engine = sent.engine;
    m.depart = sent.depart;
    m.sent = sent.sent;
    m.payload = fabric_.pool().acquire(0);
    fabric_.post(std::move(m));
  }
  return {sent.sent};
}

Message Device::recv(Stream& s, int src, Tag tag) {
  check_peer(src, "recv");
  check_abort();
  check_fault(src, /*sending=*/false);
  if (hooks_) hooks_->on_recv(cfg_.rank, src, tag);
  Message m = fabric_.take(cfg_.rank, src, tag);
  const int port = static_cast<int>(m.link.port);
  const Time first_byte = m.depart + m.link.latency_of(m.engine);
  if (first_byte < ingress_doubt_[port]) doubt_failure(cfg_.rank, "receives", first_byte, ingress_doubt_[port]);
  const Port::Booking b = ingress_[port].book(static_cast<int>(s.kind()), first_byte, m.wire_time());
  m.arrival = std::max(b.end, m.sent + m.link.latency_of(m.engine));
  s.mark("recv", s.now(), m.arrival, m.modeled_bytes, src, /*advance=*/true);
  return m;
}

void Device::set_ports(StreamKind kind, const Time egress[kNumLinkClasses], const Time ingress[kNumLinkClasses]) {
  for (int p = 0; p < kNumLinkClasses; ++p) {
    egress_[p].set_free(static_cast<int>(kind), egress[p]);
    ingress_[p].set_free(static_cast<int>(kind), ingress[p]);
  }
}

void Device::set_all_ports(const Time egress[kNumLinkClasses], const Time ingress[kNumLinkClasses]) {
  for (int p = 0; p < kNumLinkClasses; ++p) {
    egress_[p].set_all_free(egress[p]);
    ingress_[p].set_all_free(ingress[p]);
  }
}

Port::Booking Device::book_replayed(bool send, int link_class, StreamKind kind, Time ready, Time work) {
  Port& port = send ? egress_[link_class] : ingress_[link_class];
  return port.book(static_cast<int>(kind), ready, work);
}

void Device::widen_doubt(const Time egress[kNumLinkClasses], const Time ingress[kNumLinkClasses]) {
  for (int p = 0; p < kNumLinkClasses; ++p) {
    egress_doubt_[p] = std::max(egress_doubt_[p], egress[p]);
    ingress_doubt_[p] = std::max(ingress_doubt_[p], ingress[p]);
  }
}

void Device::post_control(int dst, Tag tag, std::span<const std::byte> payload) {
  check_peer(dst, "control send");
  check_abort();
  Message m;
  m.src = cfg_.rank;
  m.dst = dst;
  m.tag = tag;
  m.link = links_.link(cfg_.rank, dst);
  m.payload = fabric_.pool().acquire(payload.size());
  if (!payload.empty()) std::memcpy(m.payload.data(), payload.data(), payload.size());
  fabric_.post(std::move(m));
}

Message Device::take_control(int src, Tag tag) {
  check_peer(src, "control receive");
  check_abort();
  return fabric_.take(cfg_.rank, src, tag);
}

SendHandle Device::isend(Stream& s, int dst, Tag tag, const Tensor& t) {
  const auto* p = reinterpret_cast<const std::byte*>(t.data());
  return isend(s, dst, tag, {p, t.phantom() ? 0 : t.numel() * sizeof(float)}, t.modeled_bytes());
}

void Device::recv(Stream& s, int src, Tag tag, Tensor& into) {
  Message m = recv(s, src, tag);
  const size_t want = into.phantom() ? 0 : static_cast<size_t>(into.numel()) * sizeof(float);
  if (m.payload.size() != want || m.modeled_bytes != into.modeled_bytes()) {
    throw std::runtime_error(fmt::format(
        "device {}: recv into '{}' {} expects {} bytes, device {} sent {} (tag {:#x})", cfg_.rank,
        into.name(), shape_string(into.shape()), into.modeled_bytes(), src, m.modeled_bytes, tag));
  }
  if (want) std::memcpy(into.data(), m.payload.data(), want);
}

void Device::record(StreamKind s, const char* name, Time start, Time end, uint64_t bytes,
                    double flops, int peer) {
  if (cfg_.trace) trace_.push_back({name, s, start, end, bytes, flops, peer});
}

void Device::pace(Time t) {
  if (cfg_.pace <= 0) return;
  const auto target = wall_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(to_seconds(t) * cfg_.pace));
  // Sleep in short slices so an abort is noticed while pacing.
  while (true) {
    check_abort();
    const auto now = std::chrono::steady_clock::now();
    if (now >= target) return;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        target - now, std::chrono::milliseconds(50)));
  }
}

}  // namespace shardlab
