// Host throughput of the collectives: all_reduce of 64 MiB over 8 virtual
// GPUs (8 threads), next to plain memcpy bandwidth on the same machine.
//
// bytes_per_second is the algorithm bandwidth (buffer bytes per wall second
// per collective, nccl-tests' algbw, on the host); the busbw counter scales
// it by 2(n-1)/n. A ring all_reduce moves each byte through the channel
// about 2(n-1)/n times per rank (copy into the message, then a reduce or a
// copy out of it), so host busbw is bounded by the machine's memory
// bandwidth divided among the device threads.
#include <barrier>
#include <chrono>
#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>

#include "collectives/collectives.h"
#include "runtime/cluster.h"

namespace {

namespace coll = shardlab::collectives;

constexpr size_t kBytes = 64ull << 20;
constexpr int kRanks = 8;
constexpr int kRepeats = 3;  // collectives timed per cluster run

void BM_AllReduce64MiB8Ranks(benchmark::State& state) {
  const auto algo = static_cast<coll::Algo>(state.range(0));
  shardlab::ClusterOptions opts;
  opts.world_size = kRanks;
  shardlab::Cluster cluster(shardlab::load_profile("a100-nvlink"), opts);
  for (auto _ : state) {
    std::barrier sync(kRanks);
    std::chrono::steady_clock::time_point t0, t1;
    cluster.run([&](shardlab::Device& dev) {
      coll::ProcessGroup g = coll::ProcessGroup::world(dev);
      std::vector<float> x(kBytes / sizeof(float), 1.0f / static_cast<float>(dev.rank() + 1));
      coll::all_reduce(dev, g, x, coll::ReduceOp::kSum, {algo, std::nullopt});  // warm the pool
      sync.arrive_and_wait();
      if (dev.rank() == 0) t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kRepeats; ++i) coll::all_reduce(dev, g, x, coll::ReduceOp::kAvg, {algo, std::nullopt});
      sync.arrive_and_wait();
      if (dev.rank() == 0) t1 = std::chrono::steady_clock::now();
    });
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count() / kRepeats);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.counters["busbw_GBps"] = benchmark::Counter(
      static_cast<double>(kBytes) * 2.0 * (kRanks - 1) / kRanks / 1e9 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.SetLabel(coll::algo_name(algo));
}
BENCHMARK(BM_AllReduce64MiB8Ranks)
    ->Arg(static_cast<int>(coll::Algo::kRing))
    ->Arg(static_cast<int>(coll::Algo::kTree))
    ->Arg(static_cast<int>(coll::Algo::kDirect))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

void BM_Memcpy64MiB(benchmark::State& state) {
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_Memcpy64MiB)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
