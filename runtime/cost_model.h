// Calibrated roofline cost model for compute ops on one virtual device.
//
//   duration = launch_overhead + max(compute, bytes / (mem_bandwidth * mem_efficiency * pass_rate))
//   (no launch_overhead for a grouped kernel's later members: OpCost::launch)
//
// pass_rate is 1 except for the LayerNorm kernels (OpCost::pass), which
// move their bytes at the profile's layernorm_{fwd,bwd}_rate of that rate.
//
// and, with the calibrated GEMM model, each GEMM of the op is itself a
// roofline: max(its time on the tiles, its A, B and C at the precision over
// the achieved HBM bandwidth), so a skinny GEMM (batch-1 decode: a GEMV) is
// memory-bound and a large one compute-bound, whatever the op's other traffic.
//
// compute depends on the op's class:
//  * kElementwise (the default: softmax, LayerNorm, GELU, residuals, the
//    optimizer, copies): flops / (peak * compute_efficiency). These ops are
//    memory-bound on a GPU, so the memory term decides.
//  * kGemm: each GEMM of the op (OpCost::gemm, OpCost::gemm2) at its own
//    shape-dependent efficiency (gemm_efficiency below), plus the op's other
//    flops (bias, a fused softmax) at compute_efficiency.
//
// GEMM efficiency models cuBLAS on the SMs (NVIDIA, "Matrix Multiplication
// Background User's Guide"): the output is cut into tile_m x tile_n tiles,
// one thread block each, run in waves of sm_count blocks. Every tile costs a
// full tile's work (tile quantization) and every wave a full wave's time
// (wave quantization), so with one tile shape
//
//   efficiency = gemm_max_efficiency * (m * n * batch) / (waves * sm_count * tile_m * tile_n)
//   waves      = ceil(ceil(m / tile_m) * ceil(n / tile_n) * batch / sm_count)
//
// and, as cuBLAS's heuristics pick a tile per shape, the best of the
// profile's tiles (the first on a tie). A tile side longer than the GEMM's
// dimension shrinks to that dimension rounded up to 8 (the tensor-core MMA's
// narrow side; cuBLAS's skinny and GEMV kernels), so a one-row GEMM pays for
// 8 rows, not for a 64-row tile. It is gemm_max_efficiency for a GEMM
// that fills whole tiles and whole waves, and falls for small or skinny
// shapes that leave SMs or tile rows idle. A profile without `device.gemm`
// (sm_count 0) keeps the plain roofline: every flop at compute_efficiency,
// exactly as before the calibration.
//
// Each term is rounded up to a whole picosecond. `bytes` is the modeled
// traffic to device memory (reads + writes at the modeled element size).
#pragma once

#include <cstdint>

#include "runtime/profile.h"
#include "runtime/time.h"

namespace shardlab {

// Modeled precision: sets the element size and which peak applies. Host math
// is always fp32 (or fp64 in gradient-check tests).
//   kFp8  Transformer Engine's recipe: the linear layers' GEMMs (OpCost::fp8)
//         take FP8 operands at the profile's fp8 peak and write BF16; every
//         other kernel, the activations and the weights are BF16 (element
//         size 2), master weights and Adam moments FP32 (model/kernels.h,
//         model/train/optimizer_step.cc).
enum class Precision : uint8_t { kFp32, kBf16, kFp8 };
const char* precision_name(Precision p);
int element_size(Precision p);  // modeled bytes per element: 4, or 2 (bf16 and fp8's bf16 tensors)
inline constexpr int kFp8Bytes = 1;  // an FP8 (E4M3/E5M2) element

// What the cost model needs to know about an op besides its totals. The
// default is elementwise (memory-bound), so an OpCost{flops, bytes} built
// anywhere keeps its plain roofline.
enum class OpClass : uint8_t { kElementwise, kGemm };

// C[m, n] += A[m, k] · B[k, n], `batch` times (a batched GEMM such as
// attention's q·kᵀ over batch x heads). m == 0: no GEMM.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool empty() const { return m <= 0 || n <= 0 || k <= 0 || batch <= 0; }
  double flops() const {
    return empty() ? 0.0 : 2.0 * double(m) * double(n) * double(k) * double(batch);
  }
};

struct OpCost {
  double flops = 0;  // floating-point operations (all of them, GEMMs included)
  double bytes = 0;  // modeled bytes read + written in device memory
  OpClass op_class = OpClass::kElementwise;
  GemmShape gemm;   // kGemm: the op's GEMM
  GemmShape gemm2;  // kGemm: a second GEMM of the same op (fused backward, attention's ·v)
  // Under Precision::kFp8: the op's GEMMs read FP8 A and B and write a BF16
  // C, at the fp8 peak; the op's traffic is then those GEMMs' operands.
  bool fp8 = false;
  // A fused kernel (FlashAttention): its GEMMs' operands and outputs stay on
  // chip, so a GEMM has no HBM term of its own; the op's `bytes` is its traffic.
  bool on_chip = false;
  // A fused attention pass of `attention_seq` queries over as many keys
  // (causal: each query the keys up to its own): where the profile
  // publishes the kernel's rates (DeviceSpec::attention) and the precision
  // is not fp32, its GEMMs' FLOPs run at that rate (the softmax and the
  // masking are inside it) instead of the GEMM model.
  enum class Attention : uint8_t { kNone, kForward, kBackward };
  // Which kernel moves the op's bytes: a LayerNorm at the profile's own
  // share of the memory rate (DeviceSpec::layernorm_fwd_rate), any other
  // op at the memory rate itself.
  enum class Pass : uint8_t { kStream, kLayerNormForward, kLayerNormBackward };
  Pass pass = Pass::kStream;
  Attention attention = Attention::kNone;
  bool attention_causal = true;
  int64_t attention_seq = 0;
  // False: a later member of a grouped kernel (the local experts' GEMMs and
  // activations, model/sink.h Exec::Grouped), which its first member launched.
  bool launch = true;
};

class CostModel {
 public:
  CostModel(const DeviceSpec& spec, Precision precision);

  Time duration(const OpCost& op) const;
  // Achieved share of peak of one GEMM of this shape, (0, gemm_max_efficiency].
  double gemm_efficiency(const GemmShape& g) const;
  // Bytes one GEMM moves in HBM: A, B and C once each, at the precision
  // (fp8: A and B at 1 B, C at 2 B).
  double gemm_bytes(const GemmShape& g, bool fp8 = false) const;
  // Of those, C's: the output its epilogue stores after the main loop.
  double gemm_output_bytes(const GemmShape& g) const;
  Time launch_overhead() const { return launch_; }
  // FLOP/s at this precision, before efficiency (fp8: the BF16 peak of its
  // non-GEMM kernels, the base MFU is quoted against).
  double peak_flops() const { return peak_flops_; }
  double fp8_peak_flops() const { return fp8_peak_flops_; }  // 0 unless kFp8
  Precision precision() const { return precision_; }

 private:
  double compute_ps(const OpCost& op) const;
  bool fp8_op(const OpCost& op) const { return op.fp8 && precision_ == Precision::kFp8; }

  Precision precision_;
  double peak_flops_;       // FLOP/s
  double achieved_flops_;   // FLOP/s = peak * compute_efficiency
  double mem_bytes_per_s_;  // achieved: bandwidth * mem_efficiency
  double layernorm_rate_[2];  // DeviceSpec::layernorm_{fwd,bwd}_rate
  GemmSpec gemm_;
  double gemm_max_efficiency_;  // at this precision
  double fp8_peak_flops_ = 0;   // FLOP/s of FP8 GEMMs (kFp8)
  double fp8_max_efficiency_ = 0;
  AttentionSpec attention_;     // the fused attention kernel's published rates
  Time launch_;
};

}  // namespace shardlab
