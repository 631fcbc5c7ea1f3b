// Host speed of the unsharded tiny training step next to this machine's
// single-core fp32 GEMM rate, measured by the same binary.
//
//   BM_Sgemm/512          Eigen fp32 GEMM 512x512x512 on one core: the reference rate
//   BM_GemmNt/512         the same product by model/gemm.h's gemm_nt on one core (Eigen's
//                         blocking and bits, gebp_wide's 48 x 8 register block on AVX-512)
//   BM_TinyTrainStep      forward + backward + AdamW of `tiny` (B 8, T 64): tokens/s,
//                         GFLOP/s (FLOPs counted by the kernels' cost functions) and
//                         compare its GFLOP/s with BM_Sgemm's (the README quotes both);
//                         threads:1 on one core, threads:2 with the GEMMs and attention
//                         split over a second core (model/host_split.h), same bits
//   BM_TinyTrainStep/small  the same for `small` (issue 34's host-speed model)
//   bench/torch_compare.py  the same step in PyTorch, interleaved, as a ratio
#include <optional>
#include <vector>

#include <Eigen/Core>
#include <benchmark/benchmark.h>
#include <oneapi/tbb/global_control.h>

#include "model/config.h"
#include "model/gemm.h"
#include "model/gpt.h"
#include "model/host_split.h"
#include "model/io/data.h"
#include "model/optimizer.h"
#include "model/sink.h"

namespace shardlab {
namespace {

void BM_Sgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
  }
  const double flops = 2.0 * n * n * n * state.iterations();
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Sgemm)->Arg(512)->Unit(benchmark::kMillisecond);

void BM_GemmNt(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Eigen::VectorXf a = Eigen::VectorXf::Random(n * n), b = Eigen::VectorXf::Random(n * n);
  Eigen::VectorXf y(n * n);
  model::set_host_split_for_test(false);  // one core, as BM_Sgemm
  for (auto _ : state) {
    model::gemm_nt(y.data(), n, a.data(), n, b.data(), n, n, n, n);
    benchmark::DoNotOptimize(y.data());
  }
  model::set_host_split_for_test(std::nullopt);
  const double flops = 2.0 * double(n) * n * n * state.iterations();
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemmNt)->Arg(512)->Unit(benchmark::kMillisecond);

class FlopCounter final : public model::OpSink {
 public:
  void op(const char*, const OpCost& c) override { flops += c.flops; }
  double flops = 0;
};

void BM_TinyTrainStep(benchmark::State& state, const char* preset, int experts) {
  const oneapi::tbb::global_control cores(oneapi::tbb::global_control::max_allowed_parallelism,
                                          static_cast<size_t>(state.range(0)));
  model::GPTConfig cfg = model::preset(preset);
  cfg.n_expert = experts;
  model::GPT<float> gpt(cfg, 1337);
  FlopCounter counter;
  gpt.set_sink(&counter);
  auto data = std::make_shared<const model::TokenData>(
      model::make_synthetic_data("markov", cfg.vocab_size, cfg.block_size, 1));
  model::BatchSampler sampler(data, cfg.batch_size, cfg.block_size, model::Sampling::kRandom, 1);
  const int64_t n = gpt.table().numel();
  model::Buffer<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);
  int step = 0;
  for (auto _ : state) {
    state.PauseTiming();
    model::Batch b = sampler.next_batch(step);
    state.ResumeTiming();
    gpt.zero_grad();
    gpt.forward(b.x.data(), b.y.data(), cfg.batch_size, cfg.block_size);
    gpt.backward();
    model::adamw_update(gpt.params().data(), m.data(), v.data(), gpt.grads().data(), n, {}, 0.1, ++step);
    counter.op("adamw", model::adamw_update_cost(n, 4));
  }
  const double tokens = double(cfg.batch_size) * cfg.block_size * state.iterations();
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(counter.flops * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/step"] = counter.flops * 1e-9 / state.iterations();
}
// Wall-clock rates: with threads:2 the step's CPU time is spread over two
// threads, and the calling thread's CPU time alone would flatter it.
BENCHMARK_CAPTURE(BM_TinyTrainStep, tiny, "tiny", 0)
    ->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();
BENCHMARK_CAPTURE(BM_TinyTrainStep, tiny_moe_e4, "tiny", 4)
    ->ArgName("threads")->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();
// `small` (12M parameters, B 16, T 256): issue 34's `train --model small`
// step, whose tokens/s bench/small_vs_base.sh compares with the issue's
// baseline binary. Three steps per run: a step takes seconds.
BENCHMARK_CAPTURE(BM_TinyTrainStep, small, "small", 0)
    ->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace
}  // namespace shardlab

BENCHMARK_MAIN();
