// Host speed of the parallel configs: the same global batch of `tiny` trained
// on one virtual GPU and on two, split by data parallelism, by pipeline
// stages (4 micro-batches, 1F1B) and by tensor parallelism. With two host
// cores each device thread gets a core: dp = 2 should approach twice the
// host tokens/s (target >= 1.7x); pp and tp are limited by their bubble and
// their per-layer synchronisation.
#include <benchmark/benchmark.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"

namespace shardlab {
namespace {

// range(0): devices, range(1): 0 data, 1 pipeline, 2 tensor parallel.
void BM_TrainParallel(benchmark::State& state) {
  train::TrainOptions o;
  o.model = model::preset("tiny");
  o.steps = 10;
  const int n = static_cast<int>(state.range(0));
  switch (state.range(1)) {
    case 0: o.parallel.dp = n; break;
    case 1: o.parallel.pp = n; o.micro_batches = 4; break;
    default: o.parallel.tp = n; break;
  }
  state.SetLabel(state.range(1) == 0 ? "dp" : state.range(1) == 1 ? "pp, 4 micro-batches" : "tp");
  ClusterOptions c;
  c.world_size = o.parallel.world();
  Cluster cluster(load_profile("a100-nvlink"), c);
  double tokens = 0, loop_s = 0;
  for (auto _ : state) {
    train::TrainResult r = train::train(cluster, o);
    tokens += double(r.tokens_per_step) * o.steps;
    loop_s += r.loop_wall_s;
  }
  state.counters["tokens/s"] = tokens / loop_s;  // the step loop only, as `train` reports it
}
BENCHMARK(BM_TrainParallel)
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({2, 1})
    ->Args({2, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);

}  // namespace
}  // namespace shardlab

BENCHMARK_MAIN();
