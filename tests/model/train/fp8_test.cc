// --precision fp8 on one GPT layer on an H100, against a hand count.
//
// The layer: C = 1536 (12 heads of 128), FFN 4C, one sequence of T = 2816
// tokens (N = 2816 rows), phantom. Its four linears' forward and input-
// gradient GEMMs all fill whole 256x128 tiles and whole waves of 132 SMs
// (N = 11 x 256; every output width is a multiple of 12 x 128 = 1536:
// 11 x 12 = 132 tiles, or 4 waves of them), so each runs at the GEMM maximum:
//   bf16: 989 TFLOP/s x 0.60        fp8: 1979 TFLOP/s x 0.59 (both fitted: profile_builtin.cc)
// A kernel costs 4 us of launch plus the larger of its compute and its bytes
// over 3350 GB/s x 0.90; a GEMM's compute is the larger of its tiles' time
// and its inputs' bytes, then the store of its output (cost_model.cc); the
// GPT linears' bias adds N·OC flops at the non-GEMM rate (989 x 0.7). Hand
// count, per Transformer Engine's recipe:
//   * an FP8 GEMM moves A and B at 1 B and C at 2 B;
//   * before each forward GEMM a cast_transpose of its input (N x in):
//     read 2 B, write 1 + 1 B, 2 flops per element; before each input-
//     gradient GEMM one of its output gradient (N x out);
//   * once per step the weights' cast to FP8 and FP8ᵀ (12 C² elements) and
//     the scale update over 3 x 4 amax histories of 1024 fp32 (read and
//     written);
//   * every other kernel (layer norms, attention, GELU, the LM head, the
//     optimizer) is the BF16 run's, to the picosecond;
//   * memory: the FP8 GEMMs' inputs (ln1, ln2, the attention output, the
//     GELU output: 7 N·C elements) are kept at 1 B instead of 2, and the
//     FP8 copies of the weights add 2 B per linear weight (12 C²).
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

constexpr int64_t kC = 1536, kT = 2816, kN = kT;  // one sequence
constexpr double kLaunchPs = 4e6, kBw = 3350e9 * 0.90;
constexpr double kBf16Gemm = 989e12 * 0.60, kFp8Gemm = 1979e12 * 0.59, kOther = 989e12 * 0.7;

struct Charged {
  std::map<std::string, double> ps;  // compute time by kernel name, summed
  std::map<std::string, int> count;
  DeviceStats stats;
  double sent_bytes = 0;  // modeled bytes of every send (collectives and transfers)
};

// moe: the block's MLP an MoE layer (8 experts of width C/2, top-2, one
// shared expert of the same width).
Charged run(Precision precision, int tp = 1, bool tp_comm_overlap = false, bool moe = false) {
  TrainOptions o;
  o.model = model::preset("tiny");
  o.model.n_layer = 1;
  o.model.n_embd = kC;
  o.model.n_head = 12;
  o.model.block_size = kT;
  o.model.vocab_size = 1536;
  o.model.batch_size = 1;
  if (moe) {
    o.model.n_expert = 8;
    o.model.top_k = 2;
    o.model.n_moe_ffn = kC / 2;
    o.model.n_shared_expert = 1;
    o.model.aux_coef = 0;
  }
  o.steps = 1;
  o.phantom = true;
  HardwareProfile p = load_profile("h100-nvlink");
  p.nodes = 1;
  ClusterOptions c;
  o.parallel.tp = tp;
  o.parallel.sp = tp > 1;
  o.parallel.tp_comm_overlap = tp_comm_overlap;
  c.precision = precision;
  c.world_size = tp;
  c.trace = true;
  Cluster cluster(p, c);
  const TrainResult r = train(cluster, o);
  Charged out;
  for (const TraceEvent& e : r.run.traces.at(0).events) {
    if (std::string_view(e.name) == "send") out.sent_bytes += double(e.bytes);
    if (e.stream != StreamKind::kCompute) continue;
    out.ps[e.name] += double(e.end - e.start);
    ++out.count[e.name];
  }
  out.stats = r.run.devices.at(0);
  return out;
}

double ps(double seconds) { return std::ceil(seconds * 1e12); }

// One GEMM kernel y[m, n] = x[m, k] w[k, n] (+ bias of n per row) at full tiles.
double gemm_ps(double m, double n, double k, bool fp8, bool bias) {
  const double flops = 2 * m * n * k;
  const double in = (m * k + k * n) * (fp8 ? 1 : 2), out = m * n * 2;
  const double bytes = fp8 ? in + out : in + out + (bias ? n * 2 : 0);
  const double compute =
      ps(std::max(flops / (fp8 ? kFp8Gemm : kBf16Gemm), in / kBw) + out / kBw + (bias ? m * n / kOther : 0));
  return kLaunchPs + std::max(compute, ps(bytes / kBw));
}
double cast_ps(double elements) {
  return kLaunchPs + std::max(ps(2 * elements / kOther), ps(4 * elements / kBw));
}

struct Linear {
  const char* fwd;
  const char* dgrad;
  int64_t in, out;
  bool bias;
};
const Linear kLinears[] = {{"attn.c_attn.fwd", "attn.c_attn.dgrad", kC, 3 * kC, true},
                           {"attn.c_proj.fwd", "attn.c_proj.dgrad", kC, kC, false},  // its bias after the reduction
                           {"mlp.c_fc.fwd", "mlp.c_fc.dgrad", kC, 4 * kC, true},
                           {"mlp.c_proj.fwd", "mlp.c_proj.dgrad", 4 * kC, kC, false}};

TEST(Fp8, OneLayerTimeAndMemoryAgainstAHandCount) {
  const Charged bf16 = run(Precision::kBf16), fp8 = run(Precision::kFp8);
  double max_diff = 0;
  auto expect_ps = [&](double got, double want, const std::string& what) {
    EXPECT_EQ(got, want) << what;
    max_diff = std::max(max_diff, std::abs(got - want));
  };
  double casts = 0;
  for (const Linear& l : kLinears) {
    expect_ps(bf16.ps.at(l.fwd), gemm_ps(kN, l.out, l.in, false, l.bias), std::string("bf16 ") + l.fwd);
    expect_ps(fp8.ps.at(l.fwd), gemm_ps(kN, l.out, l.in, true, l.bias), std::string("fp8 ") + l.fwd);
    // dgrad: dx[N, in] = dy[N, out] · w[out, in]
    expect_ps(bf16.ps.at(l.dgrad), gemm_ps(kN, l.in, l.out, false, false), std::string("bf16 ") + l.dgrad);
    expect_ps(fp8.ps.at(l.dgrad), gemm_ps(kN, l.in, l.out, true, false), std::string("fp8 ") + l.dgrad);
    casts += cast_ps(double(kN * l.in)) + cast_ps(double(kN * l.out));
  }
  EXPECT_EQ(fp8.count.at("fp8.cast_transpose"), 8);
  expect_ps(fp8.ps.at("fp8.cast_transpose"), casts, "the eight activation casts");
  expect_ps(fp8.ps.at("fp8.weight_cast"), cast_ps(12.0 * kC * kC), "the weights' cast");
  const double history = 3.0 * 4 * 1024;
  expect_ps(fp8.ps.at("fp8.scale_update"),
            kLaunchPs + std::max(ps(history / kOther), ps(history * 8 / kBw)), "the scale update");
  // Everything else runs as in BF16.
  for (const auto& [name, t] : bf16.ps) {
    const bool linear = name.find(".c_attn.") != std::string::npos || name.find(".c_proj.") != std::string::npos ||
                        name.find(".c_fc.") != std::string::npos;
    if (linear && name.find("bias") == std::string::npos) continue;
    EXPECT_EQ(fp8.ps.at(name), t) << name << " is not an FP8 GEMM";
  }
  for (const auto& [name, t] : fp8.ps)
    if (name.find("wgrad") != std::string::npos && !name.starts_with("lm_head")) {
      EXPECT_LT(t, bf16.ps.at(name)) << name;
    }
  const auto kind = [](const Charged& r, MemKind k) { return double(r.stats.peak_by_kind[int(k)]); };
  EXPECT_EQ(kind(bf16, MemKind::kActivation) - kind(fp8, MemKind::kActivation), 7.0 * kN * kC);
  EXPECT_EQ(kind(fp8, MemKind::kParam) - kind(bf16, MemKind::kParam), 2.0 * 12 * kC * kC);
  EXPECT_EQ(kind(fp8, MemKind::kMaster), kind(bf16, MemKind::kMaster));
  EXPECT_EQ(kind(fp8, MemKind::kOptimizer), kind(bf16, MemKind::kOptimizer));
  std::printf("one layer fwd+bwd compute: bf16 %.3f us, fp8 %.3f us (casts %.3f us); activations %.1f -> %.1f MiB; "
              "max |hand - model| %.0f ps\n",
              double(bf16.stats.compute_busy) / 1e6, double(fp8.stats.compute_busy) / 1e6, casts / 1e6,
              kind(bf16, MemKind::kActivation) / 1048576, kind(fp8, MemKind::kActivation) / 1048576, max_diff);
}

// An MoE layer keeps its experts' FP8 GEMM inputs in FP8 too, as TE's
// grouped linears do: each routed row's input (C) and activation output
// (C/2), N·K rows, and the shared expert's activation output (N x C/2),
// besides the attention's ln1, ln2 and attention output (3 N·C); the
// experts' fc1 outputs (their activation's input) stay BF16.
TEST(Fp8, MoeLayerKeepsItsExpertsGemmInputsInFp8) {
  const Charged bf16 = run(Precision::kBf16, 1, false, true), fp8 = run(Precision::kFp8, 1, false, true);
  const auto act = [](const Charged& r) { return double(r.stats.peak_by_kind[int(MemKind::kActivation)]); };
  constexpr double K = 2, Fe = kC / 2;
  const double by_hand = 3.0 * kN * kC + kN * K * (kC + Fe) + kN * Fe;  // bytes: 1 B less each
  std::printf("one MoE layer's activations: bf16 %.0f B, fp8 %.0f B; %.0f B fewer, by hand %.0f\n", act(bf16),
              act(fp8), act(bf16) - act(fp8), by_hand);
  EXPECT_EQ(act(bf16) - act(fp8), by_hand);
}

// Under sequence parallelism Transformer Engine gathers an FP8 linear's GEMM
// input already in FP8 (layernorm_linear.py, linear.py: the LayerNorm writes
// FP8, the output gradient is cast before `gather_along_first_dim`). At tp 2
// each of a layer's six gathers (forward: ln1 before QKV, ln2 before fc1;
// backward: the output gradients before the proj and fc2 dgrads, ln1 and ln2
// again for the wgrads) sends the peer this rank's N/2 x C rows; the four
// reduce-scatters (after proj and fc2, of the QKV and fc1 dgrads) stay BF16.
// So rank 0 sends 6 x (N/2) x C bytes fewer in FP8 than in BF16, and nothing
// else it sends changes: the same with the TP-overlap forms (userbuffers'
// buffers are FP8 too).
TEST(Fp8, SequenceParallelGathersMoveFp8) {
  const double gathered = 6.0 * (kN / 2) * kC;  // elements over the six gathers, this rank's rows
  for (const bool overlap : {false, true}) {
    const Charged bf16 = run(Precision::kBf16, 2, overlap), fp8 = run(Precision::kFp8, 2, overlap);
    std::printf("tp 2, SP%s: rank 0 sends %.0f B in bf16, %.0f B in fp8 (hand count: %.0f B fewer)\n",
                overlap ? ", TP overlap" : "", bf16.sent_bytes, fp8.sent_bytes, gathered);
    EXPECT_EQ(bf16.sent_bytes - fp8.sent_bytes, gathered * (2 - 1)) << (overlap ? "with" : "without") << " overlap";
  }
}

TEST(Fp8, NeedsAnFp8Peak) {
  ClusterOptions c;
  c.precision = Precision::kFp8;
  c.world_size = 1;
  HardwareProfile p = load_profile("a100-nvlink");
  p.nodes = 1;
  EXPECT_THROW({ Cluster cluster(p, c); }, ConfigError);
}

}  // namespace
}  // namespace shardlab::train
