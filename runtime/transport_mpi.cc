// The MPI transport (transport.h). Built only when CMake finds MPI.
//
// Thread level: every MPI call of a run is made by one progress thread per
// process (funnelled), and the main thread makes the between-runs calls
// (exchange, or_bytes) only while no progress thread runs. So calls never
// overlap and MPI_THREAD_SERIALIZED suffices: device threads never call MPI,
// they queue packets for the progress thread. MPI_THREAD_MULTIPLE would let
// them call MPI_Isend themselves, but OpenMPI's multi-threaded paths are its
// least exercised, and a device thread must never block in MPI anyway.
//
// Packets: a byte string whose first byte is its kind. A data packet is a
// fabric Message (source, destination, tag, link, departure, modeled bytes,
// engine, payload) and travels under an MPI tag derived from (source,
// destination, fabric tag), so the messages of one fabric channel share a
// tag; the progress thread receives with MPI_ANY_SOURCE / MPI_ANY_TAG, and
// MPI's non-overtaking rule keeps every sender's packets in the order sent
// (a channel's FIFO order, and a process's "done" after all its data).
//
// The waits-for check across processes is the leader's, in rounds: it asks
// every process for its snapshot (Fabric::snapshot of its devices, and how
// many data packets it has sent and received), waits for every answer, then
// asks again. A deadlock is two consecutive rounds in which every process
// reports all its live devices blocked and the same counts, with as many
// packets received as sent: every process was blocked from its first
// answer to its second, and the second round's answers all come after the
// first's, so at one moment everyone was blocked and nothing was in flight.
#include <mpi.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "runtime/transport.h"
#include "runtime/wire.h"

namespace shardlab {
namespace {

enum class Kind : uint8_t { kData = 0, kAbort = 1, kAsk = 2, kAnswer = 3, kDone = 4 };
constexpr int kControlTag = 0;  // every packet but data
constexpr int kDataTags = 32000;  // MPI guarantees tags up to 32767

int data_tag(int src, int dst, Tag tag) {
  const uint64_t h = (tag * 0x9E3779B97F4A7C15ull) ^ (uint64_t(src) << 32) ^ uint64_t(dst) * 0x85EBCA6Bull;
  return 1 + static_cast<int>((h ^ (h >> 29)) % kDataTags);
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "shardlab: error: MPI %s failed (code %d)\n", what, rc);
    std::abort();
  }
}

struct Outgoing {
  int to;
  int tag;
  std::string bytes;
};

// One process's answer in a waits-for round.
struct Answer {
  bool all_blocked = false;
  uint64_t sent = 0, received = 0;
  std::vector<DeviceWait> waits;
  bool same_counts(const Answer& o) const { return all_blocked == o.all_blocked && sent == o.sent && received == o.received; }
};

class MpiTransport final : public Transport {
 public:
  MpiTransport() {
    check(MPI_Comm_rank(MPI_COMM_WORLD, &me_), "Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "Comm_size");
  }
  int process() const override { return me_; }
  int processes() const override { return size_; }

  void begin_run(Fabric& fabric, std::vector<int> owners, RunHooks hooks) override {
    fabric_ = &fabric;
    owners_ = std::move(owners);
    hooks_ = std::move(hooks);
    sent_ = received_ = 0;
    done_from_ = 0;
    local_done_ = false;
    round_ = 0;
    answers_.assign(size_t(size_), {});
    previous_.clear();
    pending_answers_ = 0;
    fabric.set_remote(this, owners_, me_);
    thread_ = std::thread([this] { progress(); });
  }

  void forward(int to, Message&& m) override {
    wire::Writer w;
    w.put(Kind::kData).put<int32_t>(m.src).put<int32_t>(m.dst).put(m.tag).put(m.link).put(m.depart);
    w.put(m.modeled_bytes).put(m.engine).put<uint64_t>(m.payload.size());
    w.put_bytes(m.payload.data(), m.payload.size());
    const int tag = data_tag(m.src, m.dst, m.tag);
    std::lock_guard lock(mu_);
    ++sent_;
    outbox_.push_back({to, tag, std::move(w.str())});
    cv_.notify_one();
  }

  void abort_others() override {
    for (int p = 0; p < size_; ++p)
      if (p != me_) push(p, wire::Writer().put(Kind::kAbort).put<uint8_t>(0).str());
  }

  void end_run() override {
    for (int p = 0; p < size_; ++p)
      if (p != me_) push(p, wire::Writer().put(Kind::kDone).str());
    {
      std::lock_guard lock(mu_);
      local_done_ = true;
      cv_.notify_one();
    }
    thread_.join();
    fabric_ = nullptr;
  }

  std::vector<std::string> exchange(const std::string& mine) override {
    const int n = static_cast<int>(mine.size());
    std::vector<int> sizes(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
    check(MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD), "Allgather");
    int total = 0;
    for (int p = 0; p < size_; ++p) offsets[size_t(p)] = std::exchange(total, total + sizes[size_t(p)]);
    std::string all(size_t(total), '\0');
    check(MPI_Allgatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE,
                         MPI_COMM_WORLD),
          "Allgatherv");
    std::vector<std::string> out;
    for (int p = 0; p < size_; ++p) out.push_back(all.substr(size_t(offsets[size_t(p)]), size_t(sizes[size_t(p)])));
    return out;
  }

  void or_bytes(std::span<std::byte> bytes) override {
    constexpr size_t kChunk = size_t{1} << 30;
    for (size_t at = 0; at < bytes.size(); at += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, bytes.size() - at));
      check(MPI_Allreduce(MPI_IN_PLACE, bytes.data() + at, n, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD), "Allreduce");
    }
  }

 private:
  void push(int to, std::string bytes) {
    std::lock_guard lock(mu_);
    outbox_.push_back({to, kControlTag, std::move(bytes)});
    cv_.notify_one();
  }
  void progress();
  bool flush_outbox();
  bool poll();
  void handle(int from, const std::string& packet);
  void deliver(wire::Reader& r);
  Answer snapshot();
  void send_answer(int round);
  void ask_round();
  void judge_round();

  int me_ = 0, size_ = 1;
  Fabric* fabric_ = nullptr;
  std::vector<int> owners_;
  RunHooks hooks_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Outgoing> outbox_;  // GUARDED_BY(mu_)
  uint64_t sent_ = 0;            // GUARDED_BY(mu_): data packets queued
  bool local_done_ = false;      // GUARDED_BY(mu_)
  // The progress thread's own state.
  // A send's bytes must stay put until MPI is done with them: on the heap,
  // not in the string itself (short strings live inside the object).
  struct InFlight {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<std::string> bytes;
  };
  std::vector<InFlight> in_flight_;
  uint64_t received_ = 0;
  int done_from_ = 0;
  int round_ = 0, pending_answers_ = 0;
  std::vector<Answer> answers_, previous_;
};

void MpiTransport::progress() {
  using Clock = std::chrono::steady_clock;
  auto next_check = Clock::now() + hooks_.period;
  auto idle = std::chrono::microseconds(0);
  int idle_polls = 0;
  while (true) {
    bool busy = flush_outbox();
    busy = poll() || busy;
    std::erase_if(in_flight_, [](InFlight& f) {  // the sends that completed
      int done = 0;
      check(MPI_Test(&f.request, &done, MPI_STATUS_IGNORE), "Test");
      return done != 0;
    });
    std::unique_lock lock(mu_);
    if (local_done_ && outbox_.empty() && in_flight_.empty() && done_from_ == size_ - 1) return;
    lock.unlock();
    if (me_ == 0 && Clock::now() >= next_check && pending_answers_ == 0) {
      if (round_ > 0) judge_round();
      ask_round();
      next_check = Clock::now() + hooks_.period;
    }
    if (busy) {
      idle = std::chrono::microseconds(0);
      idle_polls = 0;
      continue;
    }
    // Nothing moved: back off. The first idle polls only yield the core (a
    // reply is often a few microseconds away), then sleeps grow to 200 us;
    // a queued packet wakes us at once, an incoming one at the next poll.
    if (++idle_polls < 64) {
      std::this_thread::yield();
      continue;
    }
    idle = std::min(idle + std::chrono::microseconds(10), std::chrono::microseconds(200));
    lock.lock();
    cv_.wait_for(lock, idle, [&] { return !outbox_.empty() || local_done_; });
  }
}

bool MpiTransport::flush_outbox() {
  std::deque<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    out.swap(outbox_);
  }
  for (Outgoing& o : out) {
    InFlight& f = in_flight_.emplace_back(InFlight{MPI_REQUEST_NULL, std::make_unique<std::string>(std::move(o.bytes))});
    check(MPI_Isend(f.bytes->data(), static_cast<int>(f.bytes->size()), MPI_BYTE, o.to, o.tag, MPI_COMM_WORLD,
                    &f.request),
          "Isend");
  }
  return !out.empty();
}

bool MpiTransport::poll() {
  bool any = false;
  while (true) {
    int found = 0;
    MPI_Message msg;
    MPI_Status st;
    check(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &found, &msg, &st), "Improbe");
    if (!found) return any;
    int n = 0;
    check(MPI_Get_count(&st, MPI_BYTE, &n), "Get_count");
    std::string packet(size_t(n), '\0');
    check(MPI_Mrecv(packet.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "Mrecv");
    handle(st.MPI_SOURCE, packet);
    any = true;
  }
}

void MpiTransport::handle(int from, const std::string& packet) {
  wire::Reader r(packet);
  switch (r.get<Kind>()) {
    case Kind::kData:
      return deliver(r);
    case Kind::kAbort: {
      RunFailure f;
      if (r.get<uint8_t>()) {
        f.rank = r.get<int32_t>();
        f.what = r.get_string();
      }
      if (hooks_.on_abort) hooks_.on_abort(f.what.empty() ? nullptr : &f);
      return;
    }
    case Kind::kAsk:
      return send_answer(r.get<int32_t>());
    case Kind::kAnswer: {
      const auto round = r.get<int32_t>();
      Answer a;
      a.all_blocked = r.get<uint8_t>();
      a.sent = r.get<uint64_t>();
      a.received = r.get<uint64_t>();
      for (auto n = r.get<uint64_t>(); n > 0; --n) a.waits.push_back(r.get<DeviceWait>());
      if (round == round_) {
        answers_[size_t(from)] = std::move(a);
        --pending_answers_;
      }
      return;
    }
    case Kind::kDone:
      return void(++done_from_);
  }
}

void MpiTransport::deliver(wire::Reader& r) {
  Message m;
  m.src = r.get<int32_t>();
  m.dst = r.get<int32_t>();
  m.tag = r.get<Tag>();
  m.link = r.get<Link>();
  m.depart = r.get<Time>();
  m.modeled_bytes = r.get<uint64_t>();
  m.engine = r.get<Engine>();
  const auto n = r.get<uint64_t>();
  m.payload = fabric_->pool().acquire(n);
  if (n) std::memcpy(m.payload.data(), r.take(n), n);
  ++received_;
  fabric_->post(std::move(m));
}

Answer MpiTransport::snapshot() {
  Answer a;
  a.waits = fabric_->snapshot([this](int r) { return owners_[size_t(r)] == me_; });
  a.all_blocked = std::all_of(a.waits.begin(), a.waits.end(), [](const DeviceWait& w) { return w.finished || w.blocked; });
  // Read after the snapshot: a device blocked in it sends nothing until this
  // thread delivers it a message, so the counts cannot be ahead of it.
  std::lock_guard lock(mu_);
  a.sent = sent_;
  a.received = received_;
  return a;
}

void MpiTransport::send_answer(int round) {
  const Answer a = snapshot();
  wire::Writer w;
  w.put(Kind::kAnswer).put<int32_t>(round).put<uint8_t>(a.all_blocked).put(a.sent).put(a.received);
  w.put<uint64_t>(a.waits.size());
  for (const DeviceWait& d : a.waits) w.put(d);
  push(0, std::move(w.str()));
}

void MpiTransport::ask_round() {
  previous_ = answers_;
  ++round_;
  pending_answers_ = size_ - 1;
  for (int p = 1; p < size_; ++p) push(p, wire::Writer().put(Kind::kAsk).put<int32_t>(round_).str());
  answers_[0] = snapshot();
}

void MpiTransport::judge_round() {
  if (round_ < 2 || fabric_->aborted()) return;
  uint64_t sent = 0, received = 0;
  std::vector<DeviceWait> waits;
  for (int p = 0; p < size_; ++p) {
    const Answer& a = answers_[size_t(p)];
    if (!a.all_blocked || !a.same_counts(previous_[size_t(p)])) return;
    sent += a.sent;
    received += a.received;
    waits.insert(waits.end(), a.waits.begin(), a.waits.end());
  }
  if (sent != received) return;
  const std::optional<std::string> what = describe_deadlock(waits);
  if (!what) return;
  RunFailure f{-1, *what};
  for (int p = 1; p < size_; ++p)
    push(p, wire::Writer().put(Kind::kAbort).put<uint8_t>(1).put<int32_t>(-1).put_string(*what).str());
  if (hooks_.on_abort) hooks_.on_abort(&f);
}

std::unique_ptr<MpiTransport> g_mpi;

}  // namespace

ProcessSession::ProcessSession(int& argc, char**& argv) {
  // Started by mpirun? OpenMPI and MPICH (Hydra, PMI) both say so in the environment.
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE") && !std::getenv("PMIX_RANK")) return;
  int provided = 0;
  check(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "shardlab: error: this MPI does not support MPI_THREAD_SERIALIZED\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  g_mpi = std::make_unique<MpiTransport>();
  if (g_mpi->processes() == 1) {  // mpirun -np 1: alone, as without mpirun
    g_mpi.reset();
    return;
  }
  set_process_transport(g_mpi.get());
  // One output: only the leader prints (its error line is every process's:
  // they agree on a run's failure, cluster_share.h).
  if (g_mpi->process() != 0 && (!std::freopen("/dev/null", "w", stdout) || !std::freopen("/dev/null", "w", stderr)))
    std::abort();
}

ProcessSession::~ProcessSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return;
  std::fflush(stdout);
  set_process_transport(nullptr);
  g_mpi.reset();
  MPI_Finalize();
}

}  // namespace shardlab
