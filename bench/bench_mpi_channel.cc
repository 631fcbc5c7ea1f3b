// Host throughput and latency of one fabric channel: device 0 and device 1
// ping-pong messages of growing size. Alone, both devices are threads of
// this process (the in-process channel); under `mpirun -np 2` they are in
// different processes and every message crosses the MPI transport
// (runtime/transport.h). Virtual times are the same either way; this
// measures only what the host pays.
//
//   build/bin/bench_mpi_channel                    # in-process
//   mpirun -np 2 build/bin/bench_mpi_channel       # across processes
#include <chrono>
#include <cstdio>
#include <vector>

#include "runtime/cluster.h"
#include "runtime/transport.h"

using namespace shardlab;

namespace {

// Round trips of `bytes` between devices 0 and 1; returns host seconds per round trip.
double ping_pong(size_t bytes, int rounds) {
  Cluster cluster(load_profile("a100-nvlink"), {.world_size = 2});
  std::vector<double> seconds(2, 0.0);
  cluster.run([&](Device& dev) {
    std::vector<std::byte> buf(bytes);
    const int me = dev.rank(), peer = 1 - me;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      if (me == 0) dev.send(dev.comm(), peer, 1, buf, bytes);
      (void)dev.recv(dev.comm(), peer, 1);
      if (me == 1) dev.send(dev.comm(), peer, 1, buf, bytes);
    }
    seconds[size_t(me)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  merge_disjoint(seconds);
  return seconds[0] / rounds;
}

}  // namespace

int main(int argc, char** argv) {
  ProcessSession session(argc, argv);
  const Transport* t = process_transport();
  std::printf("# fabric channel, device 0 <-> device 1 %s\n",
              t ? "in different processes (MPI transport)" : "in one process (run under mpirun -np 2 to cross processes)");
  std::printf("# %10s %8s %14s %14s\n", "bytes", "rounds", "latency(us)", "throughput(MB/s)");
  for (size_t bytes = 8; bytes <= (size_t{16} << 20); bytes *= 8) {
    const int rounds = bytes <= 4096 ? 2000 : bytes <= (1 << 20) ? 200 : 20;
    const double rtt = ping_pong(bytes, rounds);
    // One-way latency is half a round trip; throughput counts both directions' bytes.
    std::printf("  %10zu %8d %14.2f %14.1f\n", bytes, rounds, rtt / 2 * 1e6, 2.0 * double(bytes) / rtt / 1e6);
  }
  return 0;
}
