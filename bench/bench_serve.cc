// Host time of real-math serving (issue 34): the tiny model with 8 heads at
// tp 1, 2 and 8, on its values (not phantom, so unfolded: one device thread
// per tp rank; host_threads 1, the default, runs them as fibers of one
// host thread, -1 of one per usable core, 0 a thread each:
// ReplicaShape::host_threads), 16 requests
// of 16 prompt and 32 output tokens arriving at once, continuous
// batching. Reported: host ms per serving step (wall time of the simulation,
// after the plan's probe step, over the steps it ran; it includes the
// replica's start: its device threads and the weights' initialisation, in
// the first step), the process's CPU time in the same region per step
// (on a loaded host the wall time is mostly waiting for a core), and the steps. At tp 8
// every step is the tiny model's 4 blocks on 8 threads with two all-reduces
// per block (of 16 rows of 128 floats in a decode), the embedding's and the
// head's collectives and the sampler's broadcast: on a 2-core host its time
// is the threads' hand-offs, not the math.
#include <chrono>
#include <ctime>

#include <benchmark/benchmark.h>

#include "model/config.h"
#include "model/serve/cluster_step.h"
#include "model/serve/serving.h"
#include "model/serve/workload.h"
#include "runtime/cluster.h"

namespace shardlab {
namespace {

void BM_ServeStep(benchmark::State& state) {
  serve::ReplicaShape shape;
  shape.model = model::preset("tiny");
  shape.model.n_head = 8;  // tp 8 splits the heads (tiny has 4)
  shape.tp = static_cast<int>(state.range(0));
  shape.host_threads = static_cast<int>(state.range(1));
  shape.phantom = false;
  serve::LengthDist prompt, output;
  prompt.a = prompt.b = 16;
  output.a = output.b = 32;
  std::vector<serve::Request> requests = serve::make_workload(16, serve::Arrival{}, prompt, output, 1);
  serve::draw_prompts(requests, shape.model.vocab_size, 1);
  serve::ServeOptions o;
  ClusterOptions c;
  c.world_size = shape.world();
  Cluster cluster(load_profile("a100-nvlink"), c);
  double wall_s = 0, cpu_s = 0;
  int64_t steps = 0;
  const auto cpu_now = [] {  // every thread of the process (the devices' host threads too)
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  for (auto _ : state) {
    serve::ClusterStepExecutor executor(cluster, shape);
    const serve::ReplicaPlan plan = executor.plan(o.scheduler.max_batch_tokens);
    o.scheduler.kv_blocks = plan.kv_blocks(0.9, o.scheduler.kv_block);
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    const serve::ServeResult r = serve::simulate_serving(requests, o, executor);
    wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu_s += cpu_now() - c0;
    steps += r.summary.steps;
    executor.finish();
  }
  state.counters["host_ms_per_step"] = 1e3 * wall_s / double(steps);
  state.counters["cpu_ms_per_step"] = 1e3 * cpu_s / double(steps);  // the same region's CPU time
  state.counters["steps"] = double(steps) / double(state.iterations());
}
BENCHMARK(BM_ServeStep)
    ->ArgNames({"tp", "host_threads"})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({8, 1})
    ->Args({8, -1})
    ->Args({8, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace shardlab

BENCHMARK_MAIN();
