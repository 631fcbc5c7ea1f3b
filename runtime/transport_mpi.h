// The MPI transport (transport.h), internal to the runtime: declared here,
// defined in transport_mpi.cc (the data path, exchange, the session) and
// transport_mpi_watchdog.cc (the waits-for rounds). Built only when CMake
// finds MPI.
//
// Thread safety: device threads only queue packets (forward, exchange_in_run)
// under mu_ (the members marked GUARDED_BY(mu_)); everything else is the
// progress thread's own or the main thread's between runs.
//
// Thread level: every MPI call of a run is made by one progress thread per
// process (funnelled), and the main thread makes the between-runs calls
// (exchange, or_bytes) only while no progress thread runs; exchange_in_run
// (a serving scheduler's, during a run) only queues packets and waits for
// the progress thread to receive the others'. So calls never
// overlap and MPI_THREAD_SERIALIZED suffices: device threads never call MPI,
// they queue packets for the progress thread. MPI_THREAD_MULTIPLE would let
// them call MPI_Isend themselves, but OpenMPI's multi-threaded paths are its
// least exercised, and a device thread must never block in MPI anyway.
//
// Packets: a byte string whose first byte is its kind. A data packet is a
// fabric Message (a header: source, destination, tag, link, departure,
// modeled bytes, engine, payload size; then its payload as a second MPI
// message, see kDataHeader) and travels under an MPI tag derived from (source,
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
//
// The heartbeat (transport_mpi_heartbeat.cc): during a run every progress
// thread sends every other process a beat each quarter of the silence
// limit (SHARDLAB_MPI_SILENCE_S seconds, default 10). A process that has
// heard nothing from a peer (not yet done with the run) for the whole
// limit has lost it (a host died or its network went silent, which TCP
// alone reports only after minutes of retransmissions): it prints one line
// naming the process and its devices and ends the job (exit 3, as a dead
// device). Beats share the TCP connection with the data, so the limit must
// exceed the time one message takes to arrive (10 s: 1 GiB at 100 MB/s).
// The progress thread never blocks in MPI: a payload's probe and receive
// are polled, the silence judged meanwhile. A progress thread that itself was not scheduled for half the
// limit (an overloaded machine) starts every peer's count again.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/transport.h"
#include "runtime/wire.h"

namespace shardlab::mpi_transport {

enum class Kind : uint8_t { kData = 0, kAbort = 1, kAsk = 2, kAnswer = 3, kDone = 4, kShare = 5, kBeat = 6 };
constexpr int kControlTag = 0;    // every packet but data
constexpr int kDataTags = 32000;  // MPI guarantees tags up to 32767

// The MPI tag of a data packet of fabric channel (src, dst, tag).
int data_tag(int src, int dst, Tag tag);
// Aborts the process with a line naming the call unless `rc` is MPI_SUCCESS.
void check(int rc, const char* what);

// A data packet's header: kind, source, destination, tag, link, departure,
// egress end, modeled bytes, engine, payload size (MpiTransport::forward). A payload
// follows as a second MPI message under the same tag, sent from the
// device's buffer and received into the receiver's (contiguous, so MPI's
// single-copy shared-memory path applies; a derived datatype over both
// parts measured 2-4x slower with OpenMPI).
constexpr size_t kDataHeader = sizeof(Kind) + 2 * sizeof(int32_t) + sizeof(Tag) + sizeof(Link) + 2 * sizeof(Time) +
                               sizeof(uint64_t) + sizeof(Engine) + sizeof(uint64_t);

struct Outgoing {
  int to;
  int tag;
  std::string bytes;           // the packet; for data, its header
  BufferPool::Buffer payload;  // data: the message's bytes, sent from its own buffer
};

using Clock = std::chrono::steady_clock;

// The silence limit: SHARDLAB_MPI_SILENCE_S (seconds, 0.5 to 3600), else 10 s.
// Exits 2 with one line for another value.
std::chrono::milliseconds silence_limit();

// "devices 4-7": the devices `owners` gives `process`.
std::string devices_of(const std::vector<int>& owners, int process);
// The line a process stopped by mpirun during a run shows (ProcessSession's
// SIGTERM handler): with two processes it names the other one.
std::string stopped_line(const std::vector<int>& owners, int me, int processes);
// A run starts (its stopped_line) or ends (null): a SIGTERM from mpirun
// during a run is a loss, shown in one line.
void set_in_run(const std::string* line);
// A line to this process's own stderr (a non-leader's normally goes to its log).
void tell_user(const std::string& line);

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
    shares_.resize(size_t(size_));
    silence_ = silence_limit();
  }
  int process() const override { return me_; }
  int processes() const override { return size_; }
  void begin_run(Fabric& fabric, std::vector<int> owners, RunHooks hooks) override;
  void forward(int to, Message&& m) override;
  void abort_others() override;
  void end_run() override;
  std::optional<std::vector<std::string>> exchange_in_run(const std::string& mine) override;
  std::vector<std::string> exchange(const std::string& mine) override;
  void or_bytes(std::span<std::byte> bytes) override;

 private:
  void set_aborted() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    share_cv_.notify_all();
  }
  void push(int to, std::string bytes) {
    std::lock_guard lock(mu_);
    outbox_.push_back({to, kControlTag, std::move(bytes), {}});
    cv_.notify_one();
  }
  void progress();
  bool flush_outbox();
  bool poll();
  void handle(int from, const std::string& packet);
  void receive_data(MPI_Message& msg, int bytes, const MPI_Status& st);
  // The waits-for rounds (transport_mpi_watchdog.cc).
  Answer snapshot();
  void send_answer(int round);
  void ask_round();
  void judge_round();
  // The heartbeat (transport_mpi_heartbeat.cc).
  void start_heartbeat();
  void heard(int from) { heard_[size_t(from)] = Clock::now(); }
  void beat_and_watch();
  // One turn of a wait inside the progress thread: sends what is queued
  // (the beats too) and judges the peers' silence.
  void watch_while_waiting() {
    flush_outbox();
    beat_and_watch();
    std::this_thread::yield();
  }
  [[noreturn]] void lost(int peer, Clock::duration silent);

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
  // exchange_in_run: each other process's strings not yet taken, and
  // whether the run was aborted (by anyone).
  std::vector<std::deque<std::string>> shares_;  // GUARDED_BY(mu_)
  bool aborted_ = false;                         // GUARDED_BY(mu_)
  std::condition_variable share_cv_;
  // The progress thread's own state.
  // A send's bytes must stay put until MPI is done with them: on the heap,
  // not in the string itself (short strings live inside the object).
  struct InFlight {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<std::string> bytes;
    BufferPool::Buffer payload;
  };
  std::vector<InFlight> in_flight_;
  uint64_t received_ = 0;
  int done_from_ = 0;
  int round_ = 0, pending_answers_ = 0;
  std::vector<Answer> answers_, previous_;
  std::chrono::milliseconds silence_{10000};
  std::vector<Clock::time_point> heard_;  // the last packet from each process
  std::vector<char> done_;                // its "done" has come: no more beats
  Clock::time_point next_beat_, last_watch_;
};

}  // namespace shardlab::mpi_transport
