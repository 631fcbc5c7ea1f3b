// The MPI transport's heartbeat (transport_mpi.h): beats to every process
// during a run, and the verdict on a peer that has gone silent.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "runtime/parse_number.h"
#include "runtime/transport_mpi.h"

namespace shardlab::mpi_transport {

std::chrono::milliseconds silence_limit() {
  const char* text = std::getenv("SHARDLAB_MPI_SILENCE_S");
  if (!text) return std::chrono::seconds(10);
  const double s = parse_number<double>(text).value_or(0);
  if (!(s >= 0.5 && s <= 3600)) {
    std::fprintf(stderr, "shardlab: error: SHARDLAB_MPI_SILENCE_S=%s: expected seconds from 0.5 to 3600\n", text);
    std::exit(2);
  }
  return std::chrono::milliseconds(std::lround(s * 1000));
}

void MpiTransport::start_heartbeat() {
  const Clock::time_point now = Clock::now();
  heard_.assign(size_t(size_), now);
  done_.assign(size_t(size_), 0);
  next_beat_ = last_watch_ = now;
}

void MpiTransport::beat_and_watch() {
  const Clock::time_point now = Clock::now();
  if (now - last_watch_ > silence_ / 2) heard_.assign(size_t(size_), now);  // we were not listening
  last_watch_ = now;
  if (now >= next_beat_) {
    for (int p = 0; p < size_; ++p)
      if (p != me_) push(p, wire::Writer().put(Kind::kBeat).str());
    next_beat_ = now + silence_ / 4;
  }
  for (int p = 0; p < size_; ++p)
    if (p != me_ && !done_[size_t(p)] && now - heard_[size_t(p)] > silence_) lost(p, now - heard_[size_t(p)]);
}

std::string devices_of(const std::vector<int>& owners, int process) {
  int first = -1, last = -1;
  for (int r = 0; r < int(owners.size()); ++r)
    if (owners[size_t(r)] == process) {
      if (first < 0) first = r;
      last = r;
    }
  if (first < 0) return "no devices";
  return first == last ? fmt::format("device {}", first) : fmt::format("devices {}-{}", first, last);
}

std::string stopped_line(const std::vector<int>& owners, int me, int processes) {
  const std::string who = processes == 2 ? fmt::format("process {} ({}) or its host failed", 1 - me, devices_of(owners, 1 - me))
                                         : std::string("another process or its host failed (mpirun names it)");
  return fmt::format("shardlab: error: process {} of {} stopped by mpirun during a run: {}, or the job was "
                     "cancelled; resume from the last checkpoint\n",
                     me, processes, who);
}

// Nothing can be agreed with a silent process (every exchange would wait
// for it), so this process says what was lost and ends the job itself.
void MpiTransport::lost(int peer, Clock::duration silent) {
  const double s = std::chrono::duration<double>(silent).count();
  tell_user(fmt::format("shardlab: error: process {} of {} ({}) lost: nothing heard from it for {:.1f} s "
                        "(limit {:g} s, SHARDLAB_MPI_SILENCE_S): its host or the network to it is down; "
                        "resume from the last checkpoint\n",
                        peer, size_, devices_of(owners_, peer), s, std::chrono::duration<double>(silence_).count()));
  // mpirun forwards the line from a pipe: give it a moment before the abort ends this process.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

}  // namespace shardlab::mpi_transport
