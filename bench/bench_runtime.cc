// Host-side speed of the runtime: how fast payloads move through a channel
// between two device threads, next to plain memcpy on the same machine.
#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>

#include "runtime/cluster.h"

namespace shardlab {
namespace {

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<std::byte> a(n, std::byte{1}), b(n);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(BM_Memcpy)->Arg(64 << 10)->Arg(1 << 20)->Arg(64 << 20);

// Device 0 streams `window` messages to device 1, which copies each into its
// own buffer (send copy + receive copy, as `shardlab p2p` does).
void BM_ChannelStream(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const int window = 16;
  Cluster cluster(load_profile("a100-nvlink"), {.world_size = 2});
  std::vector<std::byte> src(n, std::byte{3});
  for (auto _ : state) {
    cluster.run([&](Device& d) {
      if (d.rank() == 0) {
        for (int i = 0; i < window; ++i) d.isend(d.comm(), 1, 0, src, n);
      } else {
        std::vector<std::byte> dst(n);
        for (int i = 0; i < window; ++i) {
          Message m = d.recv(d.comm(), 0, 0);
          std::memcpy(dst.data(), m.bytes().data(), n);
        }
      }
    });
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * window));
}
BENCHMARK(BM_ChannelStream)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime();

// Small-message round trips: the host cost of one virtual message.
void BM_PingPong(benchmark::State& state) {
  Cluster cluster(load_profile("a100-nvlink"), {.world_size = 2});
  const int rounds = 1000;
  for (auto _ : state) {
    cluster.run([&](Device& d) {
      std::byte b[8] = {};
      for (int i = 0; i < rounds; ++i) {
        if (d.rank() == 0) {
          d.send(d.comm(), 1, 0, b, 8);
          d.recv(d.comm(), 1, 0);
        } else {
          d.recv(d.comm(), 0, 0);
          d.send(d.comm(), 0, 0, b, 8);
        }
      }
    });
  }
  state.SetItemsProcessed(state.iterations() * rounds * 2);
}
BENCHMARK(BM_PingPong)->UseRealTime();

}  // namespace
}  // namespace shardlab

BENCHMARK_MAIN();
