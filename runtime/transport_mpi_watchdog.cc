// The MPI transport's waits-for check across processes (transport_mpi.h):
// the leader's rounds of snapshots, and its verdict.
#include <algorithm>

#include "runtime/transport_mpi.h"

namespace shardlab::mpi_transport {

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
  RunFailure f{-1, *what, RunCause::kDeadlock};
  set_aborted();
  for (int p = 1; p < size_; ++p)
    push(p, wire::Writer().put(Kind::kAbort).put<uint8_t>(1).put<int32_t>(-1).put_string(*what).str());
  if (hooks_.on_abort) hooks_.on_abort(&f);
}

}  // namespace shardlab::mpi_transport
