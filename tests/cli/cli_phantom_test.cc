// `shardlab train --phantom`: GPT-3 shapes on thousands of virtual GPUs from
// the command line, what it reports, and the inputs it refuses.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/profile.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

// GPT-3 175B as run below (vocabulary padded to 51200), counted by hand.
constexpr double kL = 96, kH = 12288, kV = 51200, kT = 2048, kHeads = 96, kB = 256, kGpus = 1024;
constexpr double kPeak = 312e12;  // A100 bf16 dense

// Every parameter: per layer 12h² + 13h (qkv, proj, fc, fc-proj with
// biases, two layer norms), wte V·h, wpe T·h, the final layer norm 2h.
constexpr double kParams = kL * (12 * kH * kH + 13 * kH) + kV * kH + kT * kH + 2 * kH;

// Device 0's: TP rank 0 of stage 0, which holds 2 chunks of 6 layers (vpp 2)
// and the embeddings. Per layer: a 1/8 column of qkv and fc (with their
// biases), a 1/8 row of proj and fc-proj (full biases), both layer norms.
constexpr double kDevice0Params =
    12 * (12 * kH * kH / 8 + (3 + 4) * kH / 8 + 2 * kH + 4 * kH) + kV / 8 * kH + kT * kH;

// The paper's Eq. 3 (Narayanan et al. 2021): the GEMM FLOPs of a step with
// full recomputation, 96·B·s·l·h²·(1 + s/6h + V/16lh).
constexpr double kEq3 = 96 * kB * kT * kL * kH * kH * (1 + kT / (6 * kH) + kV / (16 * kL * kH));

// The report's summary against the hand counts.
void expect_flops_and_step(const nlohmann::json& s) {
  const double step = s["virtual_step_s"], hw = s["hardware_flops_per_step"];
  EXPECT_EQ(s["n_params"].get<double>(), kParams);
  // MFU by nanoGPT's 6N + 12·L·H·Q·T per token (N without wpe), over the step.
  const double model_flops = (6 * (kParams - kT * kH) + 12 * kL * kHeads * 128 * kT) * kB * kT;
  EXPECT_NEAR(s["mfu"].get<double>() * step * kPeak * kGpus / model_flops, 1, 1e-9);
  // What the GPUs ran is Eq. 3's GEMMs (recomputation included) and the
  // elementwise kernels and Adam: those add under 0.1%.
  std::printf("hardware FLOPs per step %.6g = Eq. 3 x %.6f; step %.4f s, HFU %.4f\n", hw, hw / kEq3, step,
              s["hfu"].get<double>());
  EXPECT_GE(hw, kEq3);
  EXPECT_LE(hw, kEq3 * 1.001);
  EXPECT_NEAR(s["hfu"].get<double>() * step * kPeak * kGpus / hw, 1, 1e-9);
  // The step is at least the FLOPs at the A100's fastest GEMM (the profile's bf16 maximum, 0.72 of peak).
  EXPECT_GE(step, hw / (kGpus * kPeak * 0.72));
}

// Mixed precision on device 0: bf16 params, fp32 grads and master, Adam's two fp32 moments.
void expect_device0_bytes(const nlohmann::json& kinds) {
  EXPECT_EQ(kinds["param"].get<double>(), 2 * kDevice0Params);
  EXPECT_EQ(kinds["grad"].get<double>(), 4 * kDevice0Params);
  EXPECT_EQ(kinds["master"].get<double>(), 4 * kDevice0Params);
  EXPECT_EQ(kinds["optimizer"].get<double>(), 8 * kDevice0Params);
}

// The README's 145.6B run ("Scale"), as Megatron-LM 2021 ran it, with the
// data-parallel all-reduce after the flush (--no-overlap) and overlapped with
// the backward. The overlapped all-reduce shares each NIC with the
// pipeline's sends (runtime/port.h) instead of queueing them behind it, so
// overlapping costs at most 2% (it cost 15% with FIFO ports: 28674.5 ms
// against 24851.6). The README quotes both step times and bubbles.
TEST(CliPhantom, OverlappedAllReduceSharesTheNicWithThePipeline) {
  const std::string run =
      "train --phantom --model megatron-145.6b --tp 8 --pp 8 --dp 24 --nodes 192 --micro-batches 96 "
      "--schedule interleaved --vpp 2 --scatter-gather --dropout 0.1 --recompute full --precision bf16 "
      "--no-grad-accum-fusion --steps 1";
  double step[2], bubble[2];
  for (int overlap = 0; overlap < 2; ++overlap) {
    const std::string report = ::testing::TempDir() + "phantom_overlap_" + std::to_string(overlap) + ".json";
    const auto r = run_cli(run + (overlap ? "" : " --no-overlap") + " --report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("dp and tp folded: 8 of 1536 devices run"), std::string::npos) << r.out;
    const auto j = nlohmann::json::parse(testing::slurp(report));
    step[overlap] = j["summary"]["virtual_step_s"].get<double>() * 1e3;
    bubble[overlap] = j["summary"]["bubble_fraction"].get<double>() * 100;
  }
  std::printf("145.6B: step %.3f ms, bubble %.1f%% with --no-overlap; %.3f ms, %.1f%% overlapped (%.4fx)\n", step[0],
              bubble[0], step[1], bubble[1], step[1] / step[0]);
  EXPECT_LE(step[1], 1.02 * step[0]);
  EXPECT_LE(bubble[1], bubble[0] + 0.5);
  // The README's figures.
  EXPECT_NEAR(step[0], 25455.132, 5e-4);
  EXPECT_NEAR(step[1], 25038.039, 5e-4);
}

// DeepSeek-V3 on 1,024 H100s with Megatron-Bridge's DeepSeek-V3 batch
// (GBS 8192, seq 4096, PP 8 x VP 4, EP 64) at TP 1, so that each node holds
// 32 experts, one routing group: group-limited routing (4 of 8 groups)
// sends a token to 4 nodes. Megatron's all-to-all dispatcher moves its 8
// (token, expert) rows on their own; DeepEP's moves it once to each of the
// 4 nodes and one row back from each. The README ("DeepEP's dispatcher")
// quotes both steps and all-to-all times.
TEST(CliPhantom, DeepEpSendsATokenToEachNodeOnce) {
  const std::string run =
      "train --phantom --model deepseek-v3 --profile h100-nvlink --nodes 128 --tp 1 --pp 8 --schedule interleaved "
      "--vpp 4 --ep 64 --dp 128 --micro-batches 64 --precision fp8 --seq 4096 --batch 8192 "
      "--use-distributed-optimizer --recompute full --steps 1 --moe-dispatcher ";
  double step[2], a2a[2], internode[2];
  const char* names[2] = {"alltoall", "deepep"};
  for (int i = 0; i < 2; ++i) {
    const std::string report = ::testing::TempDir() + "phantom_dispatcher.json";
    const auto r = run_cli(run + names[i] + " --report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(testing::slurp(report));
    step[i] = j["summary"]["virtual_step_s"].get<double>();
    a2a[i] = j["devices"][0]["moe"]["a2a_s"].get<double>();
    internode[i] = j["devices"][0]["moe"]["a2a_internode_sent_bytes"].get<double>() / (1u << 30);
  }
  std::printf("deepseek-v3 on 1024 H100s: alltoall step %.3f s (all-to-alls %.3f s, %.3f GiB to other nodes), "
              "deepep %.3f s (%.3f s, %.3f GiB)\n",
              step[0], a2a[0], internode[0], step[1], a2a[1], internode[1]);
  EXPECT_LT(a2a[1], 0.7 * a2a[0]);
  // The README's figures.
  EXPECT_NEAR(step[0], 44.355, 5e-4);
  EXPECT_NEAR(step[1], 34.701, 5e-4);
  EXPECT_NEAR(a2a[0], 19.234, 5e-4);
  EXPECT_NEAR(a2a[1], 12.333, 5e-4);
  // A token's 8 rows reach 4 nodes: DeepEP sends each token there once
  // (with 2K values more a row) and one row back, half the all-to-all's bytes.
  EXPECT_NEAR(internode[0], 588.0, 0.05);
  EXPECT_NEAR(internode[1], 294.3, 0.05);
}

// --recompute-modules trades time for memory module by module: Qwen3-30B-A3B
// in BF16 on 16 H100s, EP 16 (the FP8 row's layout below): each list keeps
// less and re-runs more, between none and full (README "Activation
// recomputation" quotes these).
TEST(CliPhantom, RecomputeModulesTradeTimeForMemory) {
  const std::string run =
      "train --phantom --model qwen3-30b-a3b --profile h100-nvlink --nodes 2 --dp 16 --ep 16 --micro-batches 64 "
      "--precision bf16 --seq 4096 --batch 1024 --use-distributed-optimizer --aux-coef 0 --steps 1 ";
  const char* lists[] = {"--recompute none", "--recompute-modules moe_act", "--recompute-modules layernorm,moe_act",
                         "--recompute-modules moe", "--recompute full"};
  const double want_step[] = {34.448, 34.614, 34.660, 46.530, 48.704};
  const double want_act[] = {31.9, 29.7, 28.9, 13.1, 4.3};  // GiB, device 0
  double last_step = 0, last_act = 1e300;
  for (int i = 0; i < 5; ++i) {
    const std::string report = ::testing::TempDir() + "phantom_recompute_modules.json";
    const auto r = run_cli(run + lists[i] + " --report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(testing::slurp(report));
    const double step = j["summary"]["virtual_step_s"].get<double>();
    const double act = j["devices"][0]["peak_bytes_by_kind"]["activation"].get<double>() / double(1ull << 30);
    std::printf("qwen3-30b-a3b bf16, 16 H100s, %s: step %.3f s, activations %.2f GiB\n", lists[i], step, act);
    EXPECT_NEAR(step, want_step[i], 5e-4) << lists[i];
    EXPECT_NEAR(act, want_act[i], 0.05) << lists[i];
    EXPECT_GT(step, last_step) << lists[i] << ": re-runs more, so takes longer";
    EXPECT_LT(act, last_act) << lists[i] << ": keeps less";
    last_step = step, last_act = act;
  }
}

// Qwen3 on H100 at Megatron-Bridge's published layouts (held out: nothing
// was fitted to them; README "H100, H200 and B200" compares): 30B-A3B on 16
// GPUs, EP 16, GBS 1024; 235B-A22B on 256, TP 2 x PP 8 x VP 4 x EP 32 with
// expert TP 1, GBS 8192; fp8, seq 4096, the distributed optimizer, no
// recomputation, forced balance (uniform phantom routing, no aux loss). The
// 235B row fits the 80 GiB as Megatron's did: its experts keep their FP8
// GEMMs' inputs in FP8 (87.8 GiB on the first stage when they counted 2 B).
TEST(CliPhantom, Qwen3RowsOnH100) {
  const std::string q30 =
      "train --phantom --model qwen3-30b-a3b --profile h100-nvlink --nodes 2 --dp 16 --ep 16 --micro-batches 64 "
      "--precision fp8 --seq 4096 --batch 1024 --use-distributed-optimizer --aux-coef 0 --steps 1 ";
  const std::string q235 =
      "train --phantom --model qwen3-235b-a22b --profile h100-nvlink --nodes 32 --tp 2 --sp --expert-tp 1 --pp 8 "
      "--schedule interleaved --vpp 4 --dp 16 --ep 32 --micro-batches 512 --precision fp8 --seq 4096 --batch 8192 "
      "--use-distributed-optimizer --aux-coef 0 --steps 1 ";
  const std::string runs[3] = {q30 + "--moe-dispatcher alltoall", q30 + "--moe-dispatcher deepep",
                               q235 + "--moe-dispatcher deepep"};
  double step[3], peak[3] = {0, 0, 0};  // the largest device's, GiB
  for (int i = 0; i < 3; ++i) {
    const std::string report = ::testing::TempDir() + "phantom_qwen3.json";
    const auto r = run_cli(runs[i] + " --report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(testing::slurp(report));
    step[i] = j["summary"]["virtual_step_s"].get<double>();
    for (const auto& d : j["devices"]) peak[i] = std::max(peak[i], d["peak_bytes"].get<double>() / double(1ull << 30));
  }
  std::printf("qwen3-30b-a3b on 16 H100s: alltoall %.3f s, deepep %.3f s (published 29.257 s); qwen3-235b-a22b on "
              "256: deepep %.3f s (published 76.561 s), largest peak %.2f GiB of 80\n",
              step[0], step[1], step[2], peak[2]);
  EXPECT_NEAR(peak[2], 77.8, 0.05);
  // The README's figures.
  EXPECT_NEAR(step[0], 31.979, 5e-4);
  EXPECT_NEAR(step[1], 23.072, 5e-4);
  EXPECT_NEAR(step[2], 72.816, 5e-4);
}

// One phantom step of `run` (with --json) without and with
// --overlap-moe-expert-parallel-comm: the step, what device 0's compute
// stream waited for the exchanges, and the largest device's peak (GiB).
struct OverlapPair {
  double step[2], waited[2], peak[2] = {0, 0};
};
OverlapPair run_overlap_pair(const std::string& run) {
  OverlapPair p;
  for (int i = 0; i < 2; ++i) {
    const auto r = run_cli(run + (i ? " --overlap-moe-expert-parallel-comm" : ""));
    EXPECT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    p.step[i] = j["summary"]["virtual_step_s"].get<double>();
    p.waited[i] = j["devices"][0]["moe"]["a2a_s"].get<double>();
    for (const auto& d : j["devices"]) p.peak[i] = std::max(p.peak[i], d["peak_bytes"].get<double>() / double(1ull << 30));
  }
  return p;
}

// Megatron-Bridge's Qwen3-30B-A3B BF16 recipe on 16 H100s (EP 16, no
// pipeline) runs Megatron's all-to-all with overlap_moe_expert_parallel_comm:
// a backward and the next micro-batch's forward as one step, each token
// exchange on the EP stream under the other micro-batch's compute. The
// figures of the README's paragraph (no published BF16 step to hold them
// against): the step and what device 0's compute stream waited for the
// exchanges, without and with it.
TEST(CliPhantom, Qwen3_30bHidesItsExchangesUnderTheOtherMicroBatch) {
  const std::string run =
      "train --phantom --model qwen3-30b-a3b --profile h100-nvlink --nodes 2 --dp 16 --ep 16 --micro-batches 64 "
      "--precision bf16 --seq 4096 --batch 1024 --use-distributed-optimizer --aux-coef 0 --steps 1 --json";
  const auto [step, waited, peak] = run_overlap_pair(run);
  std::printf("qwen3-30b-a3b bf16 on 16 H100s: step %.3f -> %.3f s, exchanges waited for %.3f -> %.3f s\n", step[0],
              step[1], waited[0], waited[1]);
  EXPECT_NEAR(step[0], 34.448, 5e-4);
  EXPECT_NEAR(step[1], 21.415, 5e-4);
  EXPECT_NEAR(waited[0], 17.006, 5e-4);
  EXPECT_NEAR(waited[1], 2.179, 5e-4);
  EXPECT_LE(step[0] - step[1], waited[0]);  // it hides at most what was waited for
}

// Megatron-Bridge's Qwen3-235B-A22B FP8 recipe runs Megatron's all-to-all
// with overlap_moe_expert_parallel_comm on its interleaved pipeline (PP 8 x
// VP 4): the combined schedule, one more warm-up forward a rank and each
// steady forward paired with another micro-batch's backward. Its layout on
// a 32nd of the batch (16 micro-batches a replica, 2 s of wall time a run;
// the README gives the full batch's, 46 and 72 s): shorter, less waited for
// the exchanges, by at most what was waited for; the largest device holds
// the extra warm-up micro-batch. The recipe's delay_wgrad_compute shortens
// it again.
TEST(CliPhantom, Qwen3_235bPairsItsMicroBatchesInTheInterleavedPipeline) {
  const std::string run =
      "train --phantom --model qwen3-235b-a22b --profile h100-nvlink --nodes 32 --tp 2 --sp --expert-tp 1 --pp 8 "
      "--schedule interleaved --vpp 4 --dp 16 --ep 32 --micro-batches 16 --precision fp8 --seq 4096 --batch 256 "
      "--use-distributed-optimizer --aux-coef 0 --steps 1 --moe-dispatcher alltoall --json";
  const auto [step, waited, peak] = run_overlap_pair(run);
  // And with the recipe's delay_wgrad_compute.
  const auto r = run_cli(run + " --overlap-moe-expert-parallel-comm --delay-wgrad-compute");
  ASSERT_EQ(r.code, 0) << r.err;
  const double delayed = nlohmann::json::parse(r.out)["summary"]["virtual_step_s"].get<double>();
  std::printf("qwen3-235b-a22b fp8 on 256 H100s, 16 micro-batches: step %.3f -> %.3f s (%.3f s with the experts' "
              "weight gradients delayed), exchanges waited for %.3f -> %.3f s, largest peak %.2f -> %.2f GiB\n",
              step[0], step[1], delayed, waited[0], waited[1], peak[0], peak[1]);
  EXPECT_NEAR(delayed, 2.574, 5e-4);
  EXPECT_LT(delayed, step[1]);
  EXPECT_NEAR(step[0], 3.140, 5e-4);
  EXPECT_NEAR(step[1], 2.631, 5e-4);
  EXPECT_NEAR(waited[0], 1.595, 5e-4);
  EXPECT_NEAR(waited[1], 1.184, 5e-4);
  EXPECT_LE(step[0] - step[1], waited[0]);
  EXPECT_GT(peak[1], peak[0]);  // one more micro-batch in flight
}

// The published row's own layout: TP 2 with expert TP 1 (--expert-tp 1), the
// EP group of 64 drawn from tp x dp (8 EP ranks a node, whole experts), each
// TP rank dispatching its own sequence-parallel rows, against the experts
// split over TP (the default: every TP rank routes all N gathered rows, so
// tp times the bytes, and a token reaches 8 nodes). Megatron-Bridge's
// recipe recomputes MLA's up-projections and the dense blocks' MLP
// (recompute_modules mla_up_proj, mlp), as the second run does, and fits the
// 80 GiB (the experts keep their FP8 GEMMs' inputs in FP8).
TEST(CliPhantom, WholeExpertsUnderTpDispatchEachRanksOwnRows) {
  const std::string run =
      "train --phantom --model deepseek-v3 --profile h100-nvlink --nodes 128 --tp 2 --sp --expert-tp 1 --pp 8 "
      "--schedule interleaved --vpp 4 --ep 64 --dp 64 --micro-batches 128 --precision fp8 --seq 4096 --batch 8192 "
      "--use-distributed-optimizer --moe-dispatcher deepep --steps 1 ";
  const std::string split =
      "train --phantom --model deepseek-v3 --profile h100-nvlink --nodes 128 --tp 2 --sp --pp 8 "
      "--schedule interleaved --vpp 4 --ep 64 --dp 64 --micro-batches 128 --precision fp8 --seq 4096 --batch 8192 "
      "--use-distributed-optimizer --moe-dispatcher alltoall --steps 1 --recompute full";
  // The recipe's recompute_modules, mla_up_proj and mlp; then split experts.
  const std::string runs[3] = {run + "--recompute full", run + "--recompute-modules mla_up_proj,mlp", split};
  double step[3], a2a[3], internode[3], peak[3];
  for (int i = 0; i < 3; ++i) {
    const std::string report = ::testing::TempDir() + "phantom_expert_tp.json";
    const auto r = run_cli(runs[i] + " --report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(testing::slurp(report));
    step[i] = j["summary"]["virtual_step_s"].get<double>();
    a2a[i] = j["devices"][0]["moe"]["a2a_s"].get<double>();
    internode[i] = j["devices"][0]["moe"]["a2a_internode_sent_bytes"].get<double>() / (1u << 30);
    peak[i] = 0;
    for (const auto& d : j["devices"]) peak[i] = std::max(peak[i], d["peak_bytes"].get<double>() / (1u << 30));
  }
  std::printf("deepseek-v3 on 1024 H100s, TP 2 x EP 64, expert TP 1, deepep: step %.3f s with full recomputation "
              "(all-to-alls %.3f s, %.3f GiB to other nodes), %.3f s with MLA's up-projections and the dense blocks' "
              "MLP's (%.3f s, fullest device %.1f GiB); experts split over TP, alltoall: %.3f s (%.3f s)\n",
              step[0], a2a[0], internode[0], step[1], a2a[1], peak[1], step[2], a2a[2]);
  // The README's figures.
  EXPECT_NEAR(step[0], 36.377, 5e-4);
  EXPECT_NEAR(a2a[0], 12.446, 5e-4);
  EXPECT_NEAR(step[1], 26.278, 5e-4);
  EXPECT_NEAR(a2a[1], 8.298, 5e-4);
  EXPECT_NEAR(peak[1], 75.2, 0.05);
  EXPECT_NEAR(step[2], 81.186, 5e-4);
  EXPECT_NEAR(a2a[2], 41.138, 5e-4);
  // Without mla_up_proj the core's q, k and v of every block in flight do not
  // fit the 80 GiB: one error line, exit 2 (the recipe lists it).
  const auto oom = run_cli(run + "--recompute-modules mlp");
  EXPECT_EQ(oom.code, 2) << oom.err;
  EXPECT_NE(oom.err.find("out of memory"), std::string::npos) << oom.err;
  // The same bytes between nodes as TP 1 x EP 64 (above): 8 EP ranks a node either way.
  EXPECT_NEAR(internode[0], 294.3, 0.05);
}

// A phantom MoE run states its assumed routing (a Zipf skew when asked:
// it said "uniform" for every run before) and, with EP, the dispatcher.
TEST(CliPhantom, MoeRunsStateTheirRoutingAndDispatcher) {
  const std::string run = "train --phantom --model nano --experts 8 --dp 4 --ep 4 --steps 1 ";
  const auto zipf = run_cli(run + "--phantom-routing zipf:1.2");
  ASSERT_EQ(zipf.code, 0) << zipf.err;
  EXPECT_NE(zipf.out.find("; MoE routing assumed Zipf-skewed (s = 1.2); tokens move by Megatron's all-to-all "
                          "dispatcher (a row per token and expert)"),
            std::string::npos)
      << zipf.out;
  const auto deepep = run_cli(run + "--moe-dispatcher deepep");
  ASSERT_EQ(deepep.code, 0) << deepep.err;
  EXPECT_NE(deepep.out.find("; MoE routing assumed uniform (a token's experts spread over its groups); tokens move "
                            "by DeepEP's dispatcher (once to each node)"),
            std::string::npos)
      << deepep.out;
}

TEST(CliPhantom, Gpt3OnAThousandGpusReportsTimeMemoryAndFolding) {
  const std::string report = ::testing::TempDir() + "phantom_report.json";
  const auto r = run_cli(
      "train --phantom --model gpt3-175b --tp 8 --pp 8 --dp 16 --nodes 128 --batch 256 "
      "--micro-batches 16 --schedule interleaved --vpp 2 --sp --recompute full --precision bf16 "
      "--steps 1 --report " + report);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("phantom run: shapes only"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dp and tp folded: 8 of 1024 devices run"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vocab 50257 padded to 51200"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(testing::slurp(report));
  EXPECT_EQ(j["devices"].size(), 1024u);
  EXPECT_EQ(j["phantom"]["running_devices"], 8);
  expect_flops_and_step(j["summary"]);
  expect_device0_bytes(j["devices"][0]["peak_bytes_by_kind"]);
  // Every device of a stage reports its representative's figures.
  EXPECT_EQ(j["devices"][1]["peak_bytes"], j["devices"][0]["peak_bytes"]);
}

// A cluster fabric (profile "fabric") gives the members of a data-parallel
// group links of different tiers: h100-roce's pods shrunk to 2 nodes, so dp 8
// over 4 nodes crosses a 7:1 tier on two of its ring's node hops. The
// replay finds the dp members ending apart and the run falls back to
// folding tp alone, 8 of 32 threads (on h100-nvlink, no fabric, dp folds by
// place: 2 of 32); the step equals the unfolded run's to the picosecond.
TEST(CliPhantom, FabricTiersFoldAsTheUnfoldedRunGoes) {
  nlohmann::json j = profile_to_json(load_profile("h100-roce"));
  j["fabric"]["tiers"][0]["nodes"] = 1;
  j["fabric"]["tiers"][1]["nodes"] = 2;
  const std::string profile = ::testing::TempDir() + "phantom_small_pods.json";
  std::ofstream(profile) << j.dump();
  const std::string run = "train --phantom --model gpt3-1.3b --tp 4 --dp 8 --nodes 4 --batch 32 --micro-batches 1 "
                          "--steps 1 --profile " + profile;
  double step[2];
  for (int fold = 0; fold < 2; ++fold) {
    const std::string report = ::testing::TempDir() + "phantom_fabric_" + std::to_string(fold) + ".json";
    const auto r = run_cli(run + (fold ? "" : " --no-fold") + " --report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find(fold ? "tp folded: 8 of 32 devices run" : "nothing folded"), std::string::npos) << r.out;
    step[fold] = nlohmann::json::parse(testing::slurp(report))["summary"]["virtual_step_s"].get<double>();
  }
  std::printf("gpt3-1.3b tp 4 dp 8 over 2-node pods: step %.12f s unfolded, %.12f s folded\n", step[0], step[1]);
  EXPECT_EQ(step[0], step[1]);
}

TEST(CliPhantom, TooBigForTheModeledGpuIsTheModeledOutOfMemory) {
  // No recomputation: the activations of GPT-3 175B do not fit an 80 GiB A100.
  // --json: no progress line on stderr, which a slow host (TSan) would print before the error.
  expect_usage_error(
      "train --phantom --model gpt3-175b --tp 8 --pp 8 --dp 2 --nodes 16 --batch 16 --micro-batches 8 "
      "--precision bf16 --steps 1 --json",
      "out of memory allocating 'activations'");
}

TEST(CliPhantom, RefusesWhatNeedsValues) {
  expect_usage_error("train --model tiny --phantom --save /tmp/phantom.safetensors", "--save cannot be combined");
  expect_usage_error("train --model tiny --phantom --init /tmp/phantom.safetensors", "--init cannot be combined");
  expect_usage_error("verify --model tiny --tp 2 --steps 1 --phantom", "verify compares values");
  // A real run the host cannot hold points at --phantom.
  expect_usage_error("train --model tiny --steps 1 --dp 8 --layers 200 --embd 1024 --heads 16",
                     "or --phantom to time it without the math");
}

}  // namespace
}  // namespace shardlab
