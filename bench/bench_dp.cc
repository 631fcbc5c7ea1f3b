// Host speed of data parallelism: the same global batch of `tiny` trained on
// dp = 1 and dp = 2 virtual GPUs. With two host cores, dp = 2 should approach
// twice the host tokens/s (issue target: >= 1.7x).
#include <benchmark/benchmark.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"

namespace shardlab {
namespace {

void BM_TrainDataParallel(benchmark::State& state) {
  train::TrainOptions o;
  o.model = model::preset("tiny");
  o.steps = 10;
  o.parallel.dp = static_cast<int>(state.range(0));
  ClusterOptions c;
  c.world_size = o.parallel.dp;
  Cluster cluster(load_profile("a100-nvlink"), c);
  double tokens = 0, loop_s = 0;
  for (auto _ : state) {
    train::TrainResult r = train::train(cluster, o);
    tokens += double(r.tokens_per_step) * o.steps;
    loop_s += r.loop_wall_s;
  }
  state.counters["tokens/s"] = tokens / loop_s;  // the step loop only, as `train` reports it
}
BENCHMARK(BM_TrainDataParallel)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

}  // namespace
}  // namespace shardlab

BENCHMARK_MAIN();
