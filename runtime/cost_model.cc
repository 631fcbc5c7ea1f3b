#include "runtime/cost_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab {

const char* precision_name(Precision p) {
  return p == Precision::kFp32 ? "fp32" : p == Precision::kBf16 ? "bf16" : "fp8";
}
int element_size(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

CostModel::CostModel(const DeviceSpec& spec, Precision precision)
    : precision_(precision),
      peak_flops_((precision == Precision::kFp32 ? spec.peak_tflops_fp32 : spec.peak_tflops_bf16) *
                  1e12),
      achieved_flops_(peak_flops_ * spec.compute_efficiency),
      mem_bytes_per_s_(spec.mem_bandwidth_GBps * 1e9 * spec.mem_efficiency),
      layernorm_rate_{spec.layernorm_fwd_rate, spec.layernorm_bwd_rate},
      gemm_(spec.gemm),
      gemm_max_efficiency_(precision == Precision::kFp32 ? spec.gemm.max_efficiency_fp32
                                                         : spec.gemm.max_efficiency_bf16),
      attention_(spec.attention),
      launch_(us_to_time(spec.launch_overhead_us)) {
  if (precision != Precision::kFp8) return;
  if (spec.peak_tflops_fp8 <= 0)
    throw ConfigError("precision fp8 needs the profile's `device.peak_tflops.fp8` (this device has no FP8 peak)");
  fp8_peak_flops_ = spec.peak_tflops_fp8 * 1e12;
  fp8_max_efficiency_ = spec.gemm.max_efficiency_fp8;
}

namespace {
// The narrowest tile side of a tensor-core kernel: mma.sync's m16n8k16 (bf16)
// and m16n8k8 (tf32) have an 8-wide side, and a skinny GEMM runs with the
// operands swapped so its few rows sit on it. cuBLAS picks such narrow (or
// GEMV) kernels for a dimension below its tiles: a one-row decode GEMM pays
// for 8 rows, not for a 64-row tile.
constexpr int64_t kMmaGranule = 8;

int64_t fitted_side(int64_t tile, int64_t dim) {
  return std::min<int64_t>(tile, (dim + kMmaGranule - 1) / kMmaGranule * kMmaGranule);
}
}  // namespace

double CostModel::gemm_efficiency(const GemmShape& g) const {
  if (gemm_.sm_count <= 0) return achieved_flops_ / peak_flops_;  // plain roofline
  SHARDLAB_CHECK(!g.empty());
  const double useful = double(g.m) * double(g.n) * double(g.batch);
  double best = 0;
  for (const GemmTile& t : gemm_.tiles) {
    const int64_t tm = fitted_side(t.m, g.m), tn = fitted_side(t.n, g.n);
    const int64_t tiles = (g.m + tm - 1) / tm * ((g.n + tn - 1) / tn) * g.batch;
    const int64_t waves = (tiles + gemm_.sm_count - 1) / gemm_.sm_count;
    const double issued = double(waves) * gemm_.sm_count * tm * tn;
    best = std::max(best, useful / issued);
  }
  return gemm_max_efficiency_ * best;
}

double CostModel::gemm_bytes(const GemmShape& g, bool fp8) const {
  if (g.empty()) return 0.0;
  const double a = double(g.m) * g.k, b = double(g.k) * g.n;
  const int in = fp8 ? kFp8Bytes : element_size(precision_);
  return (a + b) * in * double(g.batch) + gemm_output_bytes(g);
}

double CostModel::gemm_output_bytes(const GemmShape& g) const {
  return g.empty() ? 0.0 : double(g.m) * double(g.n) * element_size(precision_) * double(g.batch);
}

// Picoseconds of the op's arithmetic, rounded up once: with the calibrated
// GEMM model, each GEMM at the larger of its tiles' time and its inputs' HBM
// time, then the store of its output (a GEMM does not overlap with the next
// one). A tile's epilogue writes C after the tile's main loop has summed
// all of K, so the store adds to the loop instead of hiding under it: per
// output element a fixed 2 or 4 bytes against 2·K FLOPs, a share that
// grows as K shrinks (5% of a K = 2,304 GEMM on an A100, 1% at K =
// 12,800, more than half of attention's q·kᵀ at K = 96).
double CostModel::compute_ps(const OpCost& op) const {
  if (op.flops <= 0) return 0.0;
  if (op.attention != OpCost::Attention::kNone && !attention_.empty() && precision_ != Precision::kFp32) {
    const double s = double(op.attention_seq);
    const bool causal = op.attention_causal;
    const double tflops = op.attention == OpCost::Attention::kForward ? attention_.forward_tflops(s, causal)
                                                                       : attention_.backward_tflops(s, causal);
    return std::ceil((op.gemm.flops() + op.gemm2.flops()) / tflops);  // TFLOP/s = FLOP per ps
  }
  if (op.op_class == OpClass::kElementwise || gemm_.sm_count <= 0) {
    const double rate = fp8_op(op) ? fp8_peak_flops_ * (achieved_flops_ / peak_flops_) : achieved_flops_;
    return std::ceil(op.flops / rate * 1e12);
  }
  SHARDLAB_CHECK(!op.gemm.empty(), "a kGemm op needs its GEMM shape");
  const bool fp8 = fp8_op(op);
  // The tile/wave share at this precision's maximum, rescaled to fp8's.
  const double peak = fp8 ? fp8_peak_flops_ * fp8_max_efficiency_ / gemm_max_efficiency_ : peak_flops_;
  double seconds = 0, gemm_flops = 0;
  for (const GemmShape* g : {&op.gemm, &op.gemm2}) {
    if (g->empty()) continue;
    const double tiles = g->flops() / (peak * gemm_efficiency(*g));
    if (op.on_chip) {
      seconds += tiles;
    } else {
      const double stored = gemm_output_bytes(*g);
      seconds += std::max(tiles, (gemm_bytes(*g, fp8) - stored) / mem_bytes_per_s_) + stored / mem_bytes_per_s_;
    }
    gemm_flops += g->flops();
  }
  seconds += std::max(0.0, op.flops - gemm_flops) / achieved_flops_;  // bias, fused softmax
  return std::ceil(seconds * 1e12);
}

Time CostModel::duration(const OpCost& op) const {
  const double bytes = fp8_op(op) ? gemm_bytes(op.gemm, true) + gemm_bytes(op.gemm2, true) : op.bytes;
  const double rate = op.pass == OpCost::Pass::kStream ? mem_bytes_per_s_
                      : mem_bytes_per_s_ * layernorm_rate_[op.pass == OpCost::Pass::kLayerNormForward ? 0 : 1];
  const double memory_ps = bytes > 0 ? std::ceil(bytes / rate * 1e12) : 0.0;
  const double ps = std::max(compute_ps(op), memory_ps);
  // Past 10^6 s (or NaN: a cost given by a user's code) a kernel is no
  // kernel, and past 2^63 ps the conversion would be undefined.
  if (!(ps <= 1e18) || std::isnan(op.flops) || std::isnan(bytes))
    throw ConfigError(fmt::format("a kernel of {:g} FLOPs and {:g} bytes would take {:g} s (at most 1e6 s a kernel)",
                                  op.flops, op.bytes, ps / 1e12));
  return (op.launch ? launch_ : 0) + static_cast<Time>(ps);
}

}  // namespace shardlab
