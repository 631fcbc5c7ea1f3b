#include "runtime/fabric.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/transport.h"

namespace shardlab {

BufferPool::Buffer& BufferPool::Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (pool_ && data_) pool_->give_back(std::move(data_), bucket_);
    pool_ = o.pool_;
    data_ = std::move(o.data_);
    size_ = o.size_;
    bucket_ = o.bucket_;
    o.pool_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

BufferPool::Buffer::~Buffer() {
  if (pool_ && data_) pool_->give_back(std::move(data_), bucket_);
}

BufferPool::Buffer BufferPool::acquire(size_t bytes) {
  Buffer b;
  if (bytes == 0) return b;
  const int bucket = std::bit_width(bytes - 1);  // capacity 2^bucket >= bytes
  SHARDLAB_CHECK(bucket < kBuckets);
  {
    std::lock_guard lock(mu_);
    auto& list = free_[bucket];
    if (!list.empty()) {
      b.data_ = std::move(list.back());
      list.pop_back();
    }
  }
  if (!b.data_) b.data_.reset(new std::byte[size_t{1} << bucket]);
  b.pool_ = this;
  b.size_ = bytes;
  b.bucket_ = bucket;
  return b;
}

void BufferPool::give_back(std::unique_ptr<std::byte[]> p, int bucket) {
  std::lock_guard lock(mu_);
  if (free_[bucket].size() < kMaxCachedPerBucket) free_[bucket].push_back(std::move(p));
}

Fabric::Fabric(int world_size) {
  boxes_.reserve(static_cast<size_t>(world_size));
  for (int i = 0; i < world_size; ++i) boxes_.push_back(std::make_unique<Mailbox>());
}

void Fabric::set_remote(Transport* transport, std::vector<int> owners, int me) {
  remote_ = transport;
  owners_ = std::move(owners);
  me_ = me;
}

void Fabric::post(Message&& m) {
  if (remote_) {
    const int to = owners_[static_cast<size_t>(m.dst)];
    if (to != me_) return remote_->forward(to, std::move(m));
  }
  Mailbox& mb = *boxes_[static_cast<size_t>(m.dst)];
  bool wake = false;
  {
    std::lock_guard lock(mb.mu);
    // Only the mailbox's device thread takes from it, so at most one waiter,
    // and it waits for one (src, tag): any other message would wake it for
    // nothing. A direct all-reduce of 8 devices woke each receiver up to 7
    // times to find 1 message; on a 2-core host every such wake is a context
    // switch on the step's critical path.
    wake = mb.waiting && mb.wait_src == m.src && mb.wait_tag == m.tag;
    mb.queue.push_back(std::move(m));
  }
  if (wake) mb.waiter.wake();
}

bool Fabric::has_match(const Mailbox& mb, int src, Tag tag) {
  return std::any_of(mb.queue.begin(), mb.queue.end(),
                     [&](const Message& m) { return m.src == src && m.tag == tag; });
}

Message Fabric::take(int dst, int src, Tag tag) {
  Mailbox& mb = *boxes_[static_cast<size_t>(dst)];
  std::unique_lock lock(mb.mu);
  while (true) {
    auto it = std::find_if(mb.queue.begin(), mb.queue.end(),
                           [&](const Message& m) { return m.src == src && m.tag == tag; });
    if (it != mb.queue.end()) {
      Message m = std::move(*it);
      mb.queue.erase(it);
      mb.waiting = false;
      return m;
    }
    if (aborted()) {
      mb.waiting = false;
      throw Aborted{};
    }
    mb.waiting = true;
    mb.wait_src = src;
    mb.wait_tag = tag;
    mb.waiter.wait(lock);
  }
}

void Fabric::meet(int rank, std::span<const int> members, int index, Tag tag, void* deposit,
                  const MeetingDone& complete) {
  SHARDLAB_CHECK(deposit != nullptr && index >= 0 && size_t(index) < members.size());
  Meeting* meeting;
  {
    std::lock_guard lock(meetings_mu_);
    std::unique_ptr<Meeting>& m = meetings_[std::vector<int>(members.begin(), members.end())];
    if (!m) m = std::make_unique<Meeting>();
    meeting = m.get();
  }
  std::vector<void*> all;
  {
    std::lock_guard lock(meeting->mu);
    if (meeting->deposits.size() != members.size()) meeting->deposits.assign(members.size(), nullptr);
    SHARDLAB_CHECK(meeting->deposits[size_t(index)] == nullptr, "device arrived twice at one meeting");
    meeting->deposits[size_t(index)] = deposit;
    if (++meeting->arrived == static_cast<int>(members.size())) {
      // Nobody can arrive for the next meeting before this one wakes them:
      // the point is free again at once.
      all.swap(meeting->deposits);
      meeting->arrived = 0;
    } else {
      // Every sleeper (this one included) waits, for the watchdog, on the
      // first member not here yet: so a member that never comes is the one
      // every sleeper names. Lock order: meeting, then mailboxes.
      int missing = -1;
      for (size_t i = 0; i < members.size() && missing < 0; ++i)
        if (!meeting->deposits[i]) missing = members[i];
      for (size_t i = 0; i < members.size(); ++i) {
        if (!meeting->deposits[i]) continue;
        Mailbox& mb = *boxes_[static_cast<size_t>(members[i])];
        std::lock_guard box(mb.mu);
        mb.waiting = true;
        mb.wait_src = missing;
        mb.wait_tag = tag;
      }
    }
  }
  if (!all.empty()) {
    complete(all);
    for (size_t i = 0; i < members.size(); ++i) {
      if (static_cast<int>(i) == index) continue;
      Mailbox& mb = *boxes_[static_cast<size_t>(members[i])];
      {
        std::lock_guard lock(mb.mu);
        mb.met = true;
        mb.waiting = false;  // done as of now: the watchdog must not count it blocked
      }
      mb.waiter.wake();
    }
    return;
  }
  Mailbox& mb = *boxes_[static_cast<size_t>(rank)];
  std::unique_lock lock(mb.mu);
  while (!mb.met) {
    if (aborted()) {
      mb.waiting = false;
      throw Aborted{};
    }
    mb.waiter.wait(lock);
  }
  mb.met = false;
}

void Fabric::abort() {
  aborted_.store(true, std::memory_order_release);
  for (auto& mb : boxes_) {
    std::lock_guard lock(mb->mu);  // orders the flag before any re-check under the lock
    mb->waiter.wake();
  }
}

void Fabric::mark_finished(int rank) {
  Mailbox& mb = *boxes_[static_cast<size_t>(rank)];
  std::lock_guard lock(mb.mu);
  mb.finished = true;
}

std::vector<DeviceWait> Fabric::snapshot(const std::function<bool(int)>& keep) {
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(boxes_.size());
  for (auto& mb : boxes_) locks.emplace_back(mb->mu);
  std::vector<DeviceWait> waits;
  for (size_t r = 0; r < boxes_.size(); ++r) {
    if (!keep(int(r))) continue;
    const Mailbox& mb = *boxes_[r];
    const bool blocked = mb.waiting && !has_match(mb, mb.wait_src, mb.wait_tag);
    waits.push_back({int(r), mb.finished, blocked, mb.wait_src, mb.wait_tag});
  }
  return waits;
}

std::optional<std::string> Fabric::find_deadlock() {
  return describe_deadlock(snapshot([](int) { return true; }));
}

std::optional<std::string> describe_deadlock(const std::vector<DeviceWait>& waits) {
  std::vector<bool> finished;
  for (const DeviceWait& w : waits) {
    if (finished.size() <= size_t(w.rank)) finished.resize(size_t(w.rank) + 1);
    finished[size_t(w.rank)] = w.finished;
  }
  std::string who;
  int live = 0;
  for (const DeviceWait& w : waits) {
    if (w.finished) continue;
    ++live;
    if (!w.blocked) return std::nullopt;
    const bool peer_done = size_t(w.src) < finished.size() && finished[size_t(w.src)];
    who += fmt::format("{}device {} waits for a message from device {} (tag {:#x}){}",
                       who.empty() ? "" : "; ", w.rank, w.src, w.tag,
                       peer_done ? ", which has finished" : "");
  }
  if (live == 0) return std::nullopt;
  return "deadlock: every live device is blocked: " + who;
}

}  // namespace shardlab

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer's defaults for every binary that runs a fabric (TSAN_OPTIONS
// still overrides them): find_deadlock() holds every mailbox's lock at once,
// always in rank order (so no lock-order inversion can arise), and beyond 64
// devices that is more locks than TSan's lock-order detector can track (it
// aborts with an internal CHECK). Data races are still reported.
extern "C" const char* __tsan_default_options() { return "detect_deadlocks=0"; }
#endif
