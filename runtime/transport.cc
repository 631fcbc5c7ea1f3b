#include "runtime/transport.h"

#include <algorithm>

#include "runtime/profile.h"

namespace shardlab {

namespace {
Transport* g_transport = nullptr;  // set by ProcessSession before any thread starts
}  // namespace

Transport* process_transport() { return g_transport; }
void set_process_transport(Transport* t) { g_transport = t; }
bool leader_process() { return g_transport == nullptr || g_transport->process() == 0; }

std::vector<int> device_owners(int world, int processes, const HardwareProfile& profile) {
  std::vector<int> owners(static_cast<size_t>(world));
  const int per_node = std::max(1, profile.devices_per_node);
  const int nodes = (world + per_node - 1) / per_node;
  // Whole nodes per process keep a node's fast links inside one process.
  const int block = nodes >= processes ? (nodes + processes - 1) / processes * per_node
                                       : (world + processes - 1) / processes;
  for (int r = 0; r < world; ++r) owners[size_t(r)] = std::min(r / block, processes - 1);
  return owners;
}

#ifndef SHARDLAB_HAVE_MPI
ProcessSession::ProcessSession(int&, char**&) {}
ProcessSession::~ProcessSession() = default;
int ProcessSession::settle(int code, std::chrono::milliseconds) { return code; }
#endif

}  // namespace shardlab
