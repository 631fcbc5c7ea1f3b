// Fabric: the channels between virtual devices.
//
// Protocol (eager, like MPI's eager protocol and a LogP-style link model):
//  * The sender copies the payload into a pooled buffer and books its egress
//    port (port.h) for W/B, W being the message's bytes on the wire (its
//    payload plus packet headers, Link::wire_bytes): it departs when its
//    stream and the stream's earlier transfers on the port allow,
//      depart = max(stream time, the stream's egress free),
//    and leaves at `sent`: depart + W/B when no other stream of the device
//    moves data on the port meanwhile, later when it shares the port.
//    It never blocks on the host.
//  * The message lands in the receiver's mailbox; messages from one source
//    with one tag are delivered in FIFO order.
//  * The receiver takes it (blocking on the host until it is there) and books
//    its ingress port, in the order its program receives, for W/B from
//    depart + a (a the link's latency):
//      arrival = max(ingress end, sent + a).
//    Uncontended, arrival = depart + a + W/B. Booking in receive order (not in
//    wall-clock order) is what makes every virtual time deterministic: it
//    depends only on each device's program order, never on host scheduling.
//
// Thread safety: each mailbox is guarded by its own mutex; a device thread
// locks only its own mailbox (receive) or the destination's (send), one at a
// time. The watchdog locks all mailboxes in rank order to take a consistent
// snapshot. Ports are touched only by their owning device's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/fiber.h"
#include "runtime/link_model.h"
#include "runtime/time.h"

namespace shardlab {

using Tag = uint64_t;

// Thrown inside a device thread when the run is being torn down because of
// another device's failure or a deadlock. Never reported to the user.
struct Aborted {};

// Host storage for payloads in flight, recycled so steady-state traffic does
// not allocate. Thread-safe.
class BufferPool {
 public:
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&&) noexcept = default;
    Buffer& operator=(Buffer&&) noexcept;
    ~Buffer();
    std::byte* data() { return data_.get(); }
    const std::byte* data() const { return data_.get(); }
    size_t size() const { return size_; }

   private:
    friend class BufferPool;
    BufferPool* pool_ = nullptr;
    std::unique_ptr<std::byte[]> data_;
    size_t size_ = 0;
    int bucket_ = 0;
  };

  Buffer acquire(size_t bytes);

 private:
  void give_back(std::unique_ptr<std::byte[]> p, int bucket);
  static constexpr int kBuckets = 48;
  static constexpr size_t kMaxCachedPerBucket = 32;
  std::mutex mu_;
  std::vector<std::unique_ptr<std::byte[]>> free_[kBuckets];  // GUARDED_BY(mu_)
};

struct Message {
  int src = -1;
  int dst = -1;
  Tag tag = 0;
  Link link;
  Time depart = 0;          // egress start on the sender
  Time sent = 0;            // egress end on the sender (its last byte left)
  uint64_t modeled_bytes = 0;
  Engine engine = Engine::kSm;  // sets the packet size on the wire (link_model.h)
  BufferPool::Buffer payload;  // host bytes (empty for phantom data)
  // Filled in by the receiver when it takes the message.
  Time arrival = 0;

  Time wire_time() const { return link.wire_time(modeled_bytes, engine); }
  std::span<const std::byte> bytes() const { return {payload.data(), payload.size()}; }
};

// Test hooks at the channel boundary: called on the device's thread before a
// send is posted and before a receive blocks. May sleep (to shake the host
// schedule) or throw (to inject a failure).
class FabricHooks {
 public:
  virtual ~FabricHooks() = default;
  virtual void on_send(int src, int dst, Tag tag) {}
  virtual void on_recv(int dst, int src, Tag tag) {}
};

class Transport;
struct DeviceWait;

class Fabric {
 public:
  explicit Fabric(int world_size);

  // Across processes (transport.h): post() hands a message for a device
  // another process owns (`owners[dst] != me`) to `transport`.
  void set_remote(Transport* transport, std::vector<int> owners, int me);
  // Whether device `rank` is a thread of this process.
  bool local(int rank) const { return !remote_ || owners_[static_cast<size_t>(rank)] == me_; }

  BufferPool& pool() { return pool_; }

  // Appends to the destination's mailbox and wakes it.
  void post(Message&& m);
  // Blocks until a message from `src` with `tag` is in `dst`'s mailbox, then
  // removes and returns the oldest one. Throws Aborted when the run aborts.
  Message take(int dst, int src, Tag tag);

  // Wakes every blocked receiver; they throw Aborted.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // The device's program returned (or threw): it will send nothing more.
  void mark_finished(int rank);

  // A meeting of devices of this process (the collectives' rendezvous
  // path, collectives/rendezvous.cc): device `rank`, group index `index` of
  // `members`, arrives with `deposit` (non-null). The last to arrive runs
  // `complete` over every member's deposit (in group order) while the others
  // sleep, then wakes each of them once: one hand-off per member, where a
  // collective's messages hand off at every step. Members of one list meet
  // in the order they call (the collectives' program order). A sleeper
  // shows in snapshot() as waiting for a member that had not arrived when
  // it came, on `tag` (which no message carries), so the watchdog sees a
  // meeting some member never comes to. Throws Aborted when the run aborts;
  // if `complete` throws, the exception leaves the last member and the
  // others stay asleep until the run aborts (as a failed run does).
  using MeetingDone = std::function<void(std::span<void* const>)>;
  void meet(int rank, std::span<const int> members, int index, Tag tag, void* deposit, const MeetingDone& complete);

  // Device `rank`'s program runs as `fiber` (fiber.h; before it starts):
  // its waits in take() and meet() give its host thread to the next fiber.
  void bind_fiber(int rank, Fiber* fiber) { boxes_[static_cast<size_t>(rank)]->waiter.bind(fiber); }
  // A wait of device `rank`'s own (a serving device waiting for its next
  // batch) on the same waiter: with `lock` held, sleeps until unpark(rank)
  // or spuriously (callers loop on their condition). unpark: any thread.
  void park(int rank, std::unique_lock<std::mutex>& lock) { boxes_[static_cast<size_t>(rank)]->waiter.wait(lock); }
  void unpark(int rank) { boxes_[static_cast<size_t>(rank)]->waiter.wake(); }

  // If every device that has not finished is blocked in take() on a message
  // that is not in its mailbox, returns a description of who waits for whom.
  std::optional<std::string> find_deadlock();
  // The waits-for state of the devices `keep` selects, in rank order, taken
  // under every mailbox's lock (one consistent snapshot).
  std::vector<DeviceWait> snapshot(const std::function<bool(int)>& keep);

 private:
  struct Mailbox {
    std::mutex mu;
    HostWaiter waiter;          // its device's thread (or fiber) sleeps here
    std::deque<Message> queue;  // GUARDED_BY(mu)
    bool waiting = false;       // GUARDED_BY(mu): blocked in take()
    int wait_src = -1;          // GUARDED_BY(mu)
    Tag wait_tag = 0;           // GUARDED_BY(mu)
    bool finished = false;      // GUARDED_BY(mu)
    bool met = false;           // GUARDED_BY(mu): its meeting completed (meet)
  };
  // One list of members' meeting point: who has arrived with what.
  struct Meeting {
    std::mutex mu;
    std::vector<void*> deposits;  // GUARDED_BY(mu): by group index, null until arrived
    int arrived = 0;              // GUARDED_BY(mu)
  };
  static bool has_match(const Mailbox& mb, int src, Tag tag);

  BufferPool pool_;
  std::vector<std::unique_ptr<Mailbox>> boxes_;
  std::atomic<bool> aborted_{false};
  std::mutex meetings_mu_;
  std::map<std::vector<int>, std::unique_ptr<Meeting>> meetings_;  // GUARDED_BY(meetings_mu_)
  Transport* remote_ = nullptr;  // set before any device thread starts
  std::vector<int> owners_;
  int me_ = 0;
};

}  // namespace shardlab
