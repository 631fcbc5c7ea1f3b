// The calibrated cost model (runtime/cost_model.h) and the link packets
// (runtime/link_model.h), each expected value computed by hand from the
// formula in the header, on the built-in A100 profile.
#include "runtime/cost_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "runtime/link_model.h"
#include "runtime/profile.h"

namespace shardlab {
namespace {

// The A100 bf16 GEMM maximum of the built-in profile (runtime/profile_builtin.cc: the
// end-to-end calibration against Narayanan et al. 2021 Table 1).
constexpr double kMaxBf16 = 0.72;
// The A100 profile's achieved HBM rate: 2039 GB/s at mem_efficiency 0.90.
constexpr double kHbm = 2039e9 * 0.90;

const DeviceSpec& a100() {
  static const DeviceSpec d = load_profile("a100-nvlink").device;
  return d;
}

OpCost gemm(int64_t m, int64_t n, int64_t k, int64_t batch = 1) {
  const GemmShape g{m, n, k, batch};
  return OpCost{g.flops(), 0, OpClass::kGemm, g, {}};
}

TEST(GemmEfficiency, LargeWellShapedGemmReachesTheMaximum) {
  // 27648 = 108 x 256 rows and 1280 = 10 x 128 columns: 1080 whole 256x128
  // tiles, exactly 10 waves of 108 SMs, nothing wasted -> the profile's
  // maximum (kMaxBf16 bf16, 0.97 fp32), exactly.
  const CostModel bf16(a100(), Precision::kBf16), fp32(a100(), Precision::kFp32);
  EXPECT_DOUBLE_EQ(bf16.gemm_efficiency({27648, 1280, 4096, 1}), a100().gemm.max_efficiency_bf16);
  EXPECT_DOUBLE_EQ(fp32.gemm_efficiency({27648, 1280, 4096, 1}), a100().gemm.max_efficiency_fp32);
  EXPECT_DOUBLE_EQ(a100().gemm.max_efficiency_bf16, kMaxBf16);
  // Its time: launch 4 us + 2·m·n·k / (312e12 · kMaxBf16) s (2·27648·1280·4096
  // = 2.9e11 FLOP -> 1290.5 us; its inputs, (27648 + 1280)·4096·2 B = 237 MB,
  // take 129 us, under it), then the store of C, 27648·1280·2 B = 70.8 MB at
  // kHbm (38.6 us), rounded up to a ps.
  const double flops = 2.0 * 27648 * 1280 * 4096;
  const Time want = us_to_time(4.0) + static_cast<Time>(std::ceil(
                                          (flops / (312e12 * kMaxBf16) + 27648.0 * 1280 * 2 / kHbm) * 1e12));
  const Time got = bf16.duration(gemm(27648, 1280, 4096));
  // Tolerance 1 ps: the model divides by peak·efficiency in another order.
  EXPECT_LE(std::llabs(got - want), 1) << "difference " << got - want << " ps";
}

TEST(GemmEfficiency, NonDecreasingInSizeForSquares) {
  const CostModel m(a100(), Precision::kBf16);
  double prev = 0;
  for (int64_t s = 64; s <= 16384; s *= 2) {
    const double e = m.gemm_efficiency({s, s, s, 1});
    EXPECT_GE(e, prev) << "square " << s;
    EXPECT_LE(e, kMaxBf16) << "square " << s;
    prev = e;
  }
  // 64³: one 64x64 tile on 108 SMs: kMaxBf16 / 108.
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({64, 64, 64, 1}), kMaxBf16 * 4096 / (108.0 * 4096));
  // 16384³ with 64x64 tiles: 65536 tiles = 607 waves (65556 slots): kMaxBf16 · 65536/65556.
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({16384, 16384, 16384, 1}), kMaxBf16 * 65536 / 65556.0);
}

TEST(GemmEfficiency, QuantizationStepWhenARowCrossesATileMultiple) {
  const CostModel m(a100(), Precision::kBf16);
  // n = 128: m = 27648 fills 108 tiles of 256x128, one whole wave: kMaxBf16.
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({27648, 128, 4096, 1}), kMaxBf16);
  // One row more: 256x128 needs 109 tiles (2 waves, 0.50); 128x128 217 tiles
  // (3 waves); 128x64 434 (5 waves); 64x64 433·2 = 866 tiles in 9 waves of
  // 108: 27649·128 / (9·108·4096) = 0.8890 of the maximum, the best -> 0.6401.
  const double want = kMaxBf16 * (27649.0 * 128) / (9.0 * 108 * 4096);
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({27649, 128, 4096, 1}), want);
  EXPECT_LT(want, kMaxBf16 * 0.9);
}

TEST(GemmEfficiency, SmallAndSkinnyShapesFall) {
  const CostModel m(a100(), Precision::kBf16);
  // 2048x12288 (k 12288): 64x64 tiles, 6144 tiles in 57 waves: kMaxBf16·6144/6156.
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({2048, 12288, 12288, 1}), kMaxBf16 * 6144 / 6156.0);
  // 2048x1536: 768 tiles of 64x64 = 7.1 waves -> 8 (864 slots): kMaxBf16·768/864 = 0.640.
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({2048, 1536, 12288, 1}), kMaxBf16 * 768 / 864.0);
  // 64x128 (k 128): two 64x64 tiles on 108 SMs: kMaxBf16·2/108 = 0.0133.
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({64, 128, 128, 1}), kMaxBf16 * 2 / 108.0);
  // a batched GEMM fills the machine with its batch: 64x64 x 108 is one whole wave.
  EXPECT_DOUBLE_EQ(m.gemm_efficiency({64, 64, 64, 108}), kMaxBf16);
}

TEST(CostModel, GemmOpAddsItsGemmsEachAtItsRooflineAndChargesTheRestAtComputeEfficiency) {
  const CostModel m(a100(), Precision::kBf16);
  // g: 1080 whole 256x128 tiles, 10 waves (kMaxBf16), compute-bound: 2·27648·1280·1024
  // = 7.25e10 FLOP (323 us) against its inputs (27648·1024 + 1024·1280)·2 B = 59 MB
  // (32 us); then its C, 27648·1280·2 B = 70.8 MB (38.6 us), stored after.
  // g2: 108 64x64 tiles, one wave (kMaxBf16), memory-bound: 5.7e7 FLOP (0.25 us)
  // against its inputs 2·64·64·108·2 B = 1.77 MB (0.96 us) at kHbm, then its C,
  // 64·64·108·2 B (0.48 us). Plus 1e6 other flops at 0.7 of peak.
  const GemmShape g{27648, 1280, 1024, 1}, g2{64, 64, 64, 108};
  const OpCost op{g.flops() + g2.flops() + 1e6, 0, OpClass::kGemm, g, g2};
  const double s = g.flops() / (312e12 * kMaxBf16) + 27648.0 * 1280 * 2 / kHbm +
                   3.0 * 64 * 64 * 108 * 2 / kHbm + 1e6 / (312e12 * 0.7);
  const Time want = us_to_time(4.0) + static_cast<Time>(std::ceil(s * 1e12));
  EXPECT_LE(std::llabs(m.duration(op) - want), 1)
      << "difference " << m.duration(op) - want << " ps";
}

TEST(CostModel, AGemvIsMemoryBoundAtItsOperandBytes) {
  // Batch-1 decode through a 5120 -> 20480 fp32 layer: y[1, 20480] = x[1, 5120]·W.
  // Tiles shrink to 8 rows: 8x128 -> 160 tiles, 2 waves (20480 / (2·108·1024) =
  // 0.0926); 8x64 -> 320 tiles, 3 waves (20480 / (3·108·512) = 0.1235, the best).
  // Compute 2·5120·20480 / (19.5e12 · 0.97 · 0.1235) = 89.8 us; the operands
  // (5120 + 5120·20480 + 20480)·4 B = 419.5 MB take 228.6 us at 2039 GB/s · 0.90.
  const CostModel fp32(a100(), Precision::kFp32);
  const GemmShape g{1, 20480, 5120, 1};
  EXPECT_DOUBLE_EQ(fp32.gemm_efficiency(g), 0.97 * 20480 / (3.0 * 108 * 512));
  const double bytes = (5120.0 + 5120.0 * 20480 + 20480) * 4;
  const Time want = us_to_time(4.0) + static_cast<Time>(std::ceil(bytes / (2039e9 * 0.90) * 1e12));
  EXPECT_EQ(fp32.duration(OpCost{g.flops(), 0, OpClass::kGemm, g, {}}), want);
  EXPECT_NEAR(to_us(want), 4.0 + 228.6, 0.1);
  // The one-row GEMM no longer pays for a 64-row tile: 64 x its flops would be
  // 64 · 2·5120·20480 / (19.5e12 · 0.97) = 709 us, compute-bound.
  EXPECT_LT(to_us(want), 64 * 2.0 * 5120 * 20480 / (19.5e12 * 0.97) * 1e6 / 2);
}

TEST(CostModel, ASquareGemmIsComputeBound) {
  // 4096³ bf16: 128x64 tiles -> 2048 tiles in 19 waves (4096² / (19·108·8192) =
  // 0.99805; 64x64 ties at 38 waves, 128x128 and 256x128 fill 0.948).
  // Compute 2·4096³ / (312e12 · kMaxBf16 · 0.99805) = 613.0 us; the inputs
  // 2·4096²·2 B = 67.1 MB take 36.6 us, under it; then C, 4096²·2 B, 18.3 us.
  const CostModel bf16(a100(), Precision::kBf16);
  const GemmShape g{4096, 4096, 4096, 1};
  const double eff = kMaxBf16 * 4096.0 * 4096 / (19.0 * 108 * 8192);
  EXPECT_DOUBLE_EQ(bf16.gemm_efficiency(g), eff);
  const Time want = us_to_time(4.0) +
                    static_cast<Time>(std::ceil((g.flops() / (312e12 * eff) + 4096.0 * 4096 * 2 / kHbm) * 1e12));
  const Time got = bf16.duration(OpCost{g.flops(), 3.0 * 4096 * 4096 * 2, OpClass::kGemm, g, {}});
  EXPECT_LE(std::llabs(got - want), 1) << "difference " << got - want << " ps";
  EXPECT_NEAR(to_us(want), 4.0 + 613.0 + 18.3, 0.1);
}

TEST(CostModel, MemoryBoundOpsRunAtTheAchievedHbmBandwidth) {
  const CostModel m(a100(), Precision::kFp32);
  // residual add of 2^24 fp32 elements: 3 · 4 · 2^24 bytes at 2039 GB/s · 0.90:
  // 201326592 B / 1.8351e12 B/s = 109.71 us; its 2^24 flops take 1.2 us.
  const double bytes = 3.0 * 4 * (1 << 24);
  const Time want =
      us_to_time(4.0) + static_cast<Time>(std::ceil(bytes / (2039 * 1e9 * 0.90) * 1e12));
  EXPECT_EQ(m.duration({double(1 << 24), bytes}), want);
  EXPECT_NEAR(to_us(want), 4.0 + 109.71, 0.01);
}

TEST(CostModel, LayerNormKernelsMoveTheirBytesAtTheProfilesShareOfTheRate) {
  // The built-in profiles stream a LayerNorm like any memory-bound op
  // (layernorm rates 1); a profile with Megatron-LM 2021's apex kernel
  // (model/train/calibration.cc: 895.7822/1258.0318 forward,
  // 572.1678/1163.4357 backward, NVIDIA/apex#1037) moves the same bytes at
  // those shares of 2039 GB/s · 0.90. 2^24 bf16 elements' LayerNorm
  // forward of 64 MiB: 67108864 B / 1.8351e12 B/s = 36.57 us at the full
  // rate, / 0.71204 = 51.36 us at the forward share; backward / 0.49179.
  DeviceSpec d = a100();
  EXPECT_DOUBLE_EQ(d.layernorm_fwd_rate, 1.0);
  EXPECT_DOUBLE_EQ(d.layernorm_bwd_rate, 1.0);
  const double bytes = 2.0 * 2 * (1 << 24), rate = 2039 * 1e9 * 0.90;
  OpCost fwd{0, bytes}, bwd{0, bytes}, plain{0, bytes};
  fwd.pass = OpCost::Pass::kLayerNormForward;
  bwd.pass = OpCost::Pass::kLayerNormBackward;
  const Time at_rate = us_to_time(4.0) + static_cast<Time>(std::ceil(bytes / rate * 1e12));
  EXPECT_EQ(CostModel(d, Precision::kBf16).duration(fwd), at_rate);
  EXPECT_EQ(CostModel(d, Precision::kBf16).duration(bwd), at_rate);
  d.layernorm_fwd_rate = 895.7822 / 1258.0318;
  d.layernorm_bwd_rate = 572.1678 / 1163.4357;
  const CostModel m(d, Precision::kBf16);
  EXPECT_EQ(m.duration(plain), at_rate);
  EXPECT_EQ(m.duration(fwd), us_to_time(4.0) + static_cast<Time>(std::ceil(bytes / (rate * d.layernorm_fwd_rate) * 1e12)));
  EXPECT_EQ(m.duration(bwd), us_to_time(4.0) + static_cast<Time>(std::ceil(bytes / (rate * d.layernorm_bwd_rate) * 1e12)));
  EXPECT_NEAR(to_us(at_rate), 4.0 + 36.57, 0.01);
  EXPECT_NEAR(to_us(m.duration(fwd)), 4.0 + 51.36, 0.01);
  EXPECT_NEAR(to_us(m.duration(bwd)), 4.0 + 74.36, 0.01);
  // Through a profile file: written when not 1, read back the same.
  HardwareProfile p = load_profile("a100-nvlink");
  EXPECT_FALSE(profile_to_json(p)["device"].contains("layernorm_rate"));
  p.device = d;
  const HardwareProfile q = profile_from_json(profile_to_json(p), "ln.json");
  EXPECT_DOUBLE_EQ(q.device.layernorm_fwd_rate, d.layernorm_fwd_rate);
  EXPECT_DOUBLE_EQ(q.device.layernorm_bwd_rate, d.layernorm_bwd_rate);
}

TEST(CostModel, ProfilesWithoutTheCalibrationKeepThePlainRoofline) {
  // An old profile file: no mem_efficiency, no gemm: a GEMM op costs exactly
  // launch + max(flops / (peak · compute_efficiency), bytes / bandwidth).
  DeviceSpec old{10.0, 20.0, 1000.0, 1.0, 2.0, 0.5};
  const CostModel m(old, Precision::kFp32);
  const OpCost op{1e9, 1e3, OpClass::kGemm, {1000, 1000, 500, 1}, {}};
  EXPECT_EQ(m.duration(op), us_to_time(2.0) + us_to_time(200.0));
  EXPECT_DOUBLE_EQ(m.gemm_efficiency(op.gemm), 0.5);
}

TEST(CostModel, AProfileFileWithoutTheCalibrationFieldsReadsAsThePlainModel) {
  // A file written before the calibration: no mem_efficiency, gemm,
  // collective_launch_us or packets. It loads, and reads as the plain model.
  nlohmann::json j = profile_to_json(load_profile("a100-nvlink"));
  for (const char* k : {"mem_efficiency", "gemm", "collective_launch_us", "compute_efficiency"})
    ASSERT_EQ(j["device"].erase(k), 1u) << k;
  for (const char* cls : {"intra", "inter"}) ASSERT_EQ(j["links"][cls].erase("packet"), 1u) << cls;
  const HardwareProfile p = profile_from_json(j, "old.json");
  EXPECT_DOUBLE_EQ(p.device.mem_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(p.device.compute_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(p.device.collective_launch_us, 0.0);
  EXPECT_EQ(p.device.gemm.sm_count, 0);
  EXPECT_EQ(make_link(LinkClass::kIntra, p.intra).wire_bytes(1000, Engine::kSm), 1000u);
  // 2 GFLOP of GEMM at 312 TFLOP/s and efficiency 1: launch 4 us + 6.41 us.
  const CostModel m(p.device, Precision::kBf16);
  const OpCost op{2e9, 0, OpClass::kGemm, {1000, 1000, 1000, 1}, {}};
  EXPECT_EQ(m.duration(op), us_to_time(4.0) + static_cast<Time>(std::ceil(2e9 / 312e12 * 1e12)));
}

TEST(Links, PacketHeadersByEngine) {
  const Link l = make_link(LinkClass::kIntra, load_profile("a100-nvlink").intra);
  // NVLink3: 32 B of header per 128 B (SM) or 256 B (copy engine) of payload.
  EXPECT_EQ(l.wire_bytes(256, Engine::kSm), 256u + 2 * 32);
  EXPECT_EQ(l.wire_bytes(257, Engine::kSm), 257u + 3 * 32);
  EXPECT_EQ(l.wire_bytes(256, Engine::kCopy), 256u + 32);
  EXPECT_EQ(l.wire_bytes(0, Engine::kSm), 0u);
  // 256 MiB from the SMs: 1.25 x the payload at 300 GB/s -> 240 GB/s achieved;
  // from the copy engines 9/8 -> 266.7 GB/s.
  const uint64_t S = 256ull << 20;
  EXPECT_EQ(l.wire_time(S, Engine::kSm), transfer_time(S + S / 128 * 32, 300'000'000'000ull));
  const double sm_GBps = double(S) / to_seconds(l.wire_time(S, Engine::kSm)) / 1e9;
  const double ce_GBps = double(S) / to_seconds(l.wire_time(S, Engine::kCopy)) / 1e9;
  EXPECT_NEAR(sm_GBps, 240.0, 1e-6) << fmt::format("{:.6f}", sm_GBps);
  EXPECT_NEAR(ce_GBps, 300.0 * 256 / 288, 1e-6) << fmt::format("{:.6f}", ce_GBps);
  // A profile without packets charges the payload only (the old link model).
  LinkSpec plain{2.0, 300.0};
  EXPECT_EQ(make_link(LinkClass::kIntra, plain).wire_time(S, Engine::kSm),
            transfer_time(S, 300'000'000'000ull));
}

}  // namespace
}  // namespace shardlab
