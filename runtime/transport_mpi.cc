// The MPI transport's data path and its between-runs and in-run exchanges
// (transport_mpi.h); the process session is transport_mpi_session.cc.
#include "runtime/transport_mpi.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

namespace shardlab {
namespace mpi_transport {

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

void MpiTransport::begin_run(Fabric& fabric, std::vector<int> owners, RunHooks hooks) {
  fabric_ = &fabric;
  owners_ = std::move(owners);
  hooks_ = std::move(hooks);
  {
    // A scheduler thread may already be in exchange_in_run (a process with
    // no device of the run). Nothing of this run has arrived yet: the
    // progress thread starts below, and every packet of the last run came
    // before its end (each process's "done" is its last). An abort stays
    // set until here, so a thread waiting in exchange_in_run cannot miss it.
    std::lock_guard lock(mu_);
    sent_ = 0;
    local_done_ = false;
    aborted_ = false;
    for (auto& q : shares_) q.clear();
  }
  received_ = 0;
  done_from_ = 0;
  round_ = 0;
  answers_.assign(size_t(size_), {});
  previous_.clear();
  pending_answers_ = 0;
  start_heartbeat();
  const std::string line = stopped_line(owners_, me_, size_);
  set_in_run(&line);
  fabric.set_remote(this, owners_, me_);
  thread_ = std::thread([this] { progress(); });
}

void MpiTransport::forward(int to, Message&& m) {
  wire::Writer w;
  w.put(Kind::kData).put<int32_t>(m.src).put<int32_t>(m.dst).put(m.tag).put(m.link).put(m.depart).put(m.sent);
  w.put(m.modeled_bytes).put(m.engine).put<uint64_t>(m.payload.size());
  const int tag = data_tag(m.src, m.dst, m.tag);
  std::lock_guard lock(mu_);
  ++sent_;
  outbox_.push_back({to, tag, std::move(w.str()), std::move(m.payload)});
  cv_.notify_one();
}

void MpiTransport::abort_others() {
  set_aborted();
  for (int p = 0; p < size_; ++p)
    if (p != me_) push(p, wire::Writer().put(Kind::kAbort).put<uint8_t>(0).str());
}

void MpiTransport::end_run() {
  for (int p = 0; p < size_; ++p)
    if (p != me_) push(p, wire::Writer().put(Kind::kDone).str());
  {
    std::lock_guard lock(mu_);
    local_done_ = true;
    cv_.notify_one();
  }
  thread_.join();
  set_in_run(nullptr);
  fabric_ = nullptr;
}

std::optional<std::vector<std::string>> MpiTransport::exchange_in_run(const std::string& mine) {
  for (int p = 0; p < size_; ++p)
    if (p != me_) push(p, wire::Writer().put(Kind::kShare).put_string(mine).str());
  std::unique_lock lock(mu_);
  // Every process calls as often and each sender's packets keep their
  // order, so the front of each queue is this call's.
  share_cv_.wait(lock, [&] {
    for (int p = 0; p < size_; ++p)
      if (p != me_ && shares_[size_t(p)].empty()) return aborted_;
    return true;
  });
  if (aborted_) return std::nullopt;
  std::vector<std::string> out(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (p == me_) {
      out[size_t(p)] = mine;
      continue;
    }
    out[size_t(p)] = std::move(shares_[size_t(p)].front());
    shares_[size_t(p)].pop_front();
  }
  return out;
}

std::vector<std::string> MpiTransport::exchange(const std::string& mine) {
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

void MpiTransport::or_bytes(std::span<std::byte> bytes) {
  constexpr size_t kChunk = size_t{1} << 30;
  for (size_t at = 0; at < bytes.size(); at += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, bytes.size() - at));
    check(MPI_Allreduce(MPI_IN_PLACE, bytes.data() + at, n, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD), "Allreduce");
  }
}

void MpiTransport::progress() {
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
    beat_and_watch();
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
    InFlight& f = in_flight_.emplace_back(
        InFlight{MPI_REQUEST_NULL, std::make_unique<std::string>(std::move(o.bytes)), std::move(o.payload)});
    check(MPI_Isend(f.bytes->data(), static_cast<int>(f.bytes->size()), MPI_BYTE, o.to, o.tag, MPI_COMM_WORLD,
                    &f.request),
          "Isend");
    if (f.payload.size() == 0) continue;
    // The payload next, under the same tag (so it cannot overtake its header), from the device's buffer.
    InFlight& p = in_flight_.emplace_back(InFlight{MPI_REQUEST_NULL, nullptr, std::move(f.payload)});
    check(MPI_Isend(p.payload.data(), static_cast<int>(p.payload.size()), MPI_BYTE, o.to, o.tag, MPI_COMM_WORLD,
                    &p.request),
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
    heard(st.MPI_SOURCE);
    int n = 0;
    check(MPI_Get_count(&st, MPI_BYTE, &n), "Get_count");
    any = true;
    if (st.MPI_TAG != kControlTag) {
      receive_data(msg, n, st);
      continue;
    }
    std::string packet(size_t(n), '\0');
    check(MPI_Mrecv(packet.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "Mrecv");
    handle(st.MPI_SOURCE, packet);
  }
}

void MpiTransport::handle(int from, const std::string& packet) {
  wire::Reader r(packet);
  switch (r.get<Kind>()) {
    case Kind::kData:  // never under the control tag: poll() receives data itself
      std::fprintf(stderr, "shardlab: error: MPI transport: a data packet under the control tag\n");
      std::abort();
    case Kind::kAbort: {
      RunFailure f;
      if (r.get<uint8_t>()) {  // only the leader's deadlock watchdog sends a failure
        f.rank = r.get<int32_t>();
        f.what = r.get_string();
        f.cause = RunCause::kDeadlock;
      }
      set_aborted();
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
      done_[size_t(from)] = 1;
      return void(++done_from_);
    case Kind::kBeat:
      return;
    case Kind::kShare: {
      std::string s = r.get_string();
      std::lock_guard lock(mu_);
      shares_[size_t(from)].push_back(std::move(s));
      share_cv_.notify_all();
      return;
    }
  }
}

// A data packet into the fabric: the header, then (the same source and
// tag's next message) the payload straight into a pool buffer the
// receiving device will own.
void MpiTransport::receive_data(MPI_Message& msg, int bytes, const MPI_Status& st) {
  if (size_t(bytes) != kDataHeader) {
    std::fprintf(stderr, "shardlab: error: MPI transport: a data header of %d bytes\n", bytes);
    std::abort();
  }
  std::string header(kDataHeader, '\0');
  check(MPI_Mrecv(header.data(), bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "Mrecv");
  wire::Reader r(header);
  (void)r.get<Kind>();
  Message m;
  m.src = r.get<int32_t>();
  m.dst = r.get<int32_t>();
  m.tag = r.get<Tag>();
  m.link = r.get<Link>();
  m.depart = r.get<Time>();
  m.sent = r.get<Time>();
  m.modeled_bytes = r.get<uint64_t>();
  m.engine = r.get<Engine>();
  m.payload = fabric_->pool().acquire(r.get<uint64_t>());
  if (m.payload.size() > 0) {
    // Sent right after the header; the waits watch the peers, since the
    // link may go down in between (a blocking probe or receive would then
    // never return, and no heartbeat verdict would come).
    MPI_Message body;
    MPI_Status bs;
    for (int found = 0; !found; watch_while_waiting())
      check(MPI_Improbe(st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &found, &body, &bs), "Improbe");
    int n = 0;
    check(MPI_Get_count(&bs, MPI_BYTE, &n), "Get_count");
    if (size_t(n) != m.payload.size()) {
      std::fprintf(stderr, "shardlab: error: MPI transport: a payload's size disagrees with its header\n");
      std::abort();
    }
    MPI_Request req;
    check(MPI_Imrecv(m.payload.data(), n, MPI_BYTE, &body, &req), "Imrecv");
    for (int done = 0; !done; watch_while_waiting()) check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "Test");
  }
  ++received_;
  fabric_->post(std::move(m));
}

}  // namespace mpi_transport
}  // namespace shardlab
