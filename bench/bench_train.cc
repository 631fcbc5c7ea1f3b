// Host speed of the unsharded tiny training step next to this machine's
// single-core fp32 GEMM rate, measured by the same binary.
//
//   BM_FmaPeak            the single-core fp32 multiply-add peak of this CPU: independent
//                         fused multiply-adds on registers only (widest vectors the build
//                         targets), GFLOP/s; the ceiling every GEMM rate below is a share of
//   BM_Sgemm/512          Eigen fp32 GEMM 512x512x512 on one core: the reference rate
//   BM_GemmNt/512         the same product by model/gemm.h's gemm_nt on one core (Eigen's
//                         blocking and bits, gebp_wide's 48 x 8 register block on AVX-512)
//   BM_TinyGemms/fwd|bwd  the linear layers' GEMMs of one tiny step (every c_attn, c_proj,
//                         c_fc and the LM head, the shapes and calls model/kernels.cc
//                         makes), alone on one core: their GFLOP/s in the step's shapes
//   BM_TinyAttention      the step's attention (4 blocks, forward and the recomputing
//                         backward) alone on one core
//   BM_TinyTrainStep      forward + backward + AdamW of `tiny` (B 8, T 64): tokens/s,
//                         GFLOP/s (FLOPs counted by the kernels' cost functions), those
//                         FLOPs by part (linear GEMMs forward and backward, attention's
//                         GEMMs, element-wise, optimizer) and the step's GFLOP/s;
//                         threads:1 on one core, threads:2 with the GEMMs and attention
//                         split over a second core (model/host_split.h), same bits
//   BM_TinyTrainStep/small  the same for `small` (issue 34's host-speed model)
//   bench/torch_compare.py  the same step in PyTorch, interleaved, as a ratio
#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

#include <Eigen/Core>
#include <benchmark/benchmark.h>
#include <oneapi/tbb/global_control.h>

#include "model/config.h"
#include "model/gemm.h"
#include "model/gpt.h"
#include "model/host_split.h"
#include "model/io/data.h"
#include "model/kernels.h"
#include "model/optimizer.h"
#include "model/sink.h"

namespace shardlab {
namespace {

// Multiply-adds per loop iteration: kAcc independent chains (enough to
// cover the FMA latency on every pipe: Zen 4 has 2 pipes of 4 cycles, Intel
// cores 2 of 4), each on one register of Eigen's widest float packet for the
// build (16 lanes on AVX-512, 8 on AVX2, 4 on SSE and NEON; pmadd is the
// fused multiply-add where the build has one). Nothing leaves the registers
// until the end.
constexpr int kAcc = 16;
using FmaVec = Eigen::internal::packet_traits<float>::type;
constexpr int kLanes = Eigen::internal::packet_traits<float>::size;

void BM_FmaPeak(benchmark::State& state) {
  constexpr int64_t kSteps = 1 << 16;  // loop iterations per benchmark iteration
  FmaVec acc[kAcc];
  namespace ei = Eigen::internal;
  for (int i = 0; i < kAcc; ++i) acc[i] = ei::pset1<FmaVec>(1.0f + 1e-3f * float(i));
  const FmaVec a = ei::pset1<FmaVec>(0.999999f), b = ei::pset1<FmaVec>(1e-7f);
  for (auto _ : state) {
    for (int64_t s = 0; s < kSteps; ++s) {
#pragma GCC unroll 16
      for (int i = 0; i < kAcc; ++i) acc[i] = ei::pmadd(acc[i], a, b);
    }
    // the accumulators stay live (and in registers) across iterations
    for (int i = 0; i < kAcc; ++i) benchmark::DoNotOptimize(acc[i]);
  }
  float sum = 0, lanes[kLanes];
  for (int i = 0; i < kAcc; ++i) {
    ei::pstoreu(lanes, acc[i]);
    sum += lanes[0];
  }
  benchmark::DoNotOptimize(sum);
  const double flops = 2.0 * kLanes * kAcc * double(kSteps) * double(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
  state.counters["lanes"] = kLanes;
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond);

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

// The linear layers of one step of `cfg` (the shapes model/layers.cc and
// gpt.cc give model/kernels.h's linear_forward and linear_backward): per
// block c_attn (C -> 3C), attn c_proj (C -> C), c_fc (C -> F), mlp c_proj
// (F -> C), then the LM head (C -> V, no bias, tied to wte).
struct LinearShape {
  int in, out;
  bool bias;
};
std::vector<LinearShape> step_linears(const model::GPTConfig& cfg) {
  const int C = cfg.n_embd, F = cfg.ffn_hidden();
  std::vector<LinearShape> s;
  for (int l = 0; l < cfg.n_layer; ++l) s.insert(s.end(), {{C, 3 * C, true}, {C, C, true}, {C, F, true}, {F, C, true}});
  s.push_back({C, cfg.vocab_size, false});
  return s;
}

// The step's linear GEMMs alone, one core, in the step's shapes: forward
// (y = x·Wᵀ + b: gemm_nt_bias, the head gemm_nt) or backward (dx += dy·W and
// dW += dyᵀ·x: gemm_nn_acc, gemm_tn_acc; the bias gradient's column sums
// are element-wise, left out). Each layer its own operands, as in the step.
void BM_TinyGemms(benchmark::State& state, bool backward) {
  const model::GPTConfig cfg = model::preset("tiny");
  const int64_t N = int64_t(cfg.batch_size) * cfg.block_size;
  struct Operands {
    Eigen::VectorXf x, w, b, y;
  };
  std::vector<Operands> ops;
  double flops = 0;
  for (const LinearShape& l : step_linears(cfg)) {
    ops.push_back({Eigen::VectorXf::Random(N * l.in), Eigen::VectorXf::Random(int64_t(l.out) * l.in),
                   Eigen::VectorXf::Random(l.out), Eigen::VectorXf::Random(N * l.out)});
    flops += (backward ? 4.0 : 2.0) * double(N) * l.in * l.out;
  }
  const std::vector<LinearShape> shapes = step_linears(cfg);
  Eigen::Index widest = 0, largest = 0;
  for (const Operands& o : ops) largest = std::max(largest, o.w.size());
  for (const LinearShape& l : shapes) widest = std::max(widest, Eigen::Index(l.in));
  Eigen::VectorXf dx = Eigen::VectorXf::Zero(N * widest), dw = Eigen::VectorXf::Zero(largest);
  model::set_host_split_for_test(false);
  for (auto _ : state) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const LinearShape& l = shapes[i];
      Operands& o = ops[i];
      if (!backward) {
        model::linear_forward(o.y.data(), o.x.data(), o.w.data(), l.bias ? o.b.data() : nullptr, N, l.in, l.out);
      } else {
        model::linear_backward(dx.data(), dw.data(), static_cast<float*>(nullptr), o.y.data(), o.x.data(),
                               o.w.data(), N, l.in, l.out);
      }
    }
    benchmark::ClobberMemory();
  }
  model::set_host_split_for_test(std::nullopt);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/step"] = flops * 1e-9;
}

// The step's attention alone, one core: per block the forward
// (attention_forward, the probabilities in scratch) and the backward that
// recomputes it (attention_forward_backward), as model/layers.cc runs them
// for tiny; FLOPs as the cost functions count them (full T×T products).
void BM_TinyAttention(benchmark::State& state) {
  const model::GPTConfig cfg = model::preset("tiny");
  const int B = cfg.batch_size, T = cfg.block_size, NH = cfg.n_head, HS = cfg.head_size();
  const int64_t N = int64_t(B) * T, C = cfg.n_embd;
  std::vector<Eigen::VectorXf> qkv;
  for (int l = 0; l < cfg.n_layer; ++l) qkv.push_back(Eigen::VectorXf::Random(N * 3 * C));
  const Eigen::VectorXf dout = Eigen::VectorXf::Random(N * C);
  Eigen::VectorXf out(N * C), dqkv = Eigen::VectorXf::Zero(N * 3 * C);
  model::set_host_split_for_test(false);
  for (auto _ : state) {
    for (const Eigen::VectorXf& x : qkv) model::attention_forward(out.data(), static_cast<float*>(nullptr), x.data(), B, T, NH, HS);
    for (const Eigen::VectorXf& x : qkv) model::attention_forward_backward(out.data(), dqkv.data(), dout.data(), x.data(), B, T, NH, HS);
    benchmark::ClobberMemory();
  }
  model::set_host_split_for_test(std::nullopt);
  const double flops = cfg.n_layer * (model::attention_forward_cost(B, T, NH, HS, 4).flops +
                                      model::attention_backward_cost(B, T, NH, HS, 4).flops);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/step"] = flops * 1e-9;
}
BENCHMARK(BM_TinyAttention)->Unit(benchmark::kMillisecond);

// The FLOPs the kernels' cost functions charge (the model's FLOPs, what a
// GPU or torch computes; the host's recomputation is not in them), by part:
// the linear layers' GEMMs forward and backward, attention's GEMMs (q·kᵀ,
// att·v and their gradients, full T×T), the optimizer, and everything else
// (biases, LayerNorm, GELU, softmax, residuals, cross-entropy, embedding).
class FlopCounter final : public model::OpSink {
 public:
  void op(const char* name, const OpCost& c) override {
    flops += c.flops;
    const std::string_view n(name);
    const double gemm = c.op_class == OpClass::kGemm ? c.gemm.flops() + c.gemm2.flops() : 0.0;
    if (n == "adamw") {
      optimizer += c.flops;
      return;
    }
    if (n.starts_with("attn.softmax."))
      attention_gemm += gemm;
    else if (n.ends_with(".bwd"))
      linear_bwd += gemm;
    else
      linear_fwd += gemm;
    elementwise += c.flops - gemm;
  }
  double flops = 0, linear_fwd = 0, linear_bwd = 0, attention_gemm = 0, elementwise = 0, optimizer = 0;
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
  const double per_step = 1e-9 / double(state.iterations());
  state.counters["GFLOP/step"] = counter.flops * per_step;
  state.counters["GF_lin_fwd"] = counter.linear_fwd * per_step;
  state.counters["GF_lin_bwd"] = counter.linear_bwd * per_step;
  state.counters["GF_att_gemm"] = counter.attention_gemm * per_step;
  state.counters["GF_elementw"] = counter.elementwise * per_step;
  state.counters["GF_optim"] = counter.optimizer * per_step;
}
BENCHMARK_CAPTURE(BM_TinyGemms, fwd, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TinyGemms, bwd, true)->Unit(benchmark::kMillisecond);
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
