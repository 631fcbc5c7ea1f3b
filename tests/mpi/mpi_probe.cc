// Failures across processes, for tests/mpi/mpi_compare.sh: the same program
// run alone and under mpirun must end with the same line and exit code.
//
//   mpi_probe deadlock   devices 0 and 3 each wait for the other (4 devices:
//                        under -np 2 they are in different processes)
//   mpi_probe error      device 3 fails after a round of messages (exit 2)
//   mpi_probe share      as error, while the main thread trades strings with
//                        the other processes during the run (exchange_in_run,
//                        as serve's scheduler does): the failure must end the
//                        trading everywhere, not leave a process waiting
//   mpi_probe lone       process 1 fails before a run that process 0 starts
//   mpi_probe lone_leader  the same with process 0 failing (for mpi_expect.sh:
//                        the job must end with exit 2 and the failed one's line)
//
// A run that should fail but does not exits 0 with "no failure" (the
// driver then sees different outputs).
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "runtime/transport.h"

using namespace shardlab;

namespace {

void exchange_ring(Device& dev) {
  const int n = dev.world_size(), me = dev.rank();
  float x = float(me);
  dev.isend(dev.comm(), (me + 1) % n, 1, {reinterpret_cast<const std::byte*>(&x), sizeof x}, 1024);
  (void)dev.recv(dev.comm(), (me + n - 1) % n, 1);
}

void program(Device& dev, const std::string& mode) {
  exchange_ring(dev);
  if (mode == "deadlock" && (dev.rank() == 0 || dev.rank() == 3)) (void)dev.recv(dev.comm(), 3 - dev.rank(), 7);
  if (mode != "deadlock" && dev.rank() == 3) throw ConfigError("bad input met on this device");
}

// The share mode's run: in a thread of its own, while this thread trades
// strings with the other processes until the run is aborted.
int run_and_share(Cluster& cluster, Transport& t, const std::string& mode) {
  std::exception_ptr error;
  bool mixed = false;
  std::thread runner([&] {
    try {
      cluster.run([&](Device& dev) { program(dev, mode); });
    } catch (...) {
      error = std::current_exception();
    }
  });
  // Rounds until the run is aborted; each must hold every process's string.
  for (int round = 0;; ++round) {
    const std::optional<std::vector<std::string>> all = t.exchange_in_run(std::to_string(round));
    if (!all) break;
    for (const std::string& s : *all) mixed = mixed || s != std::to_string(round);
  }
  runner.join();
  if (mixed) {  // exits 1 where the run alone exits 2: the driver fails
    std::fprintf(stderr, "mpi_probe: error: exchange_in_run mixed up its rounds\n");
    return 1;
  }
  if (error) std::rethrow_exception(error);
  return 0;
}

int probe(const std::string& mode) {
  try {
    Cluster cluster(load_profile("a100-nvlink"), {.world_size = 4, .watchdog_period = std::chrono::milliseconds(20)});
    Transport* t = process_transport();
    if (mode == "lone" || mode == "lone_leader") {  // one process fails before the run the other starts
      if (t && t->process() == (mode == "lone" ? 1 : 0)) throw ConfigError("only this process fails");
      cluster.run(exchange_ring);
    } else if (mode == "share" && t) {
      if (const int code = run_and_share(cluster, *t, mode)) return code;
    } else {
      cluster.run([&](Device& dev) { program(dev, mode); });
    }
  } catch (const RunError& e) {
    if (leader_process()) std::fprintf(stderr, "mpi_probe: error: %s\n", e.what());
    return e.input_error() ? 2 : 1;
  } catch (const ConfigError& e) {  // outside a run: a non-leader's line goes to its log (settle shows it)
    std::fprintf(stderr, "mpi_probe: error: %s\n", e.what());
    return 2;
  }
  std::printf("no failure\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ProcessSession session(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "deadlock" && mode != "error" && mode != "share" && mode != "lone" && mode != "lone_leader") {
    std::fprintf(stderr, "usage: mpi_probe deadlock|error|share|lone|lone_leader\n");
    return 2;
  }
  return session.settle(probe(mode), std::chrono::seconds(2));
}
