// `shardlab verify`: sharded runs match the unsharded model, and the check can fail.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/params.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;
using testing::slurp;

nlohmann::json verify(const std::string& args, int expect_code = 0) {
  auto r = run_cli("verify --model tiny --steps 5 --json " + args);
  EXPECT_EQ(r.code, expect_code) << args << "\n" << r.err << r.out.substr(0, 2000);
  return nlohmann::json::parse(r.out);
}

// The sharded run matches the unsharded model within the default tolerances
// (1e-5: per-step relative loss difference, relative L2 of the parameters and,
// with --grads, of the step-0 gradients). Checks the numbers, not only the
// tool's own verdict; a NaN is reported as null and fails get<double>().
void expect_matches(const nlohmann::json& j, const std::string& args, bool grads) {
  const double loss = j.at("max_loss_rel_diff").get<double>(), param = j.at("param_rel_l2").get<double>();
  const double grad = grads ? j.at("grad_rel_l2").get<double>() : 0.0;
  char grad_text[32] = "not checked";
  if (grads) std::snprintf(grad_text, sizeof grad_text, "%.3e", grad);
  std::printf("%s: max loss rel diff %.3e, parameter rel L2 %.3e, step-0 gradient rel L2 %s (tolerances 1e-5)\n",
              args.c_str(), loss, param, grad_text);
  EXPECT_TRUE(j.at("passed").get<bool>()) << args;
  EXPECT_LE(loss, 1e-5) << args;
  EXPECT_LE(param, 1e-5) << args;
  if (grads) {
    EXPECT_LE(grad, 1e-5) << args;
  }
  EXPECT_TRUE(j.at("first_mismatch").is_null()) << args << ": " << j.at("first_mismatch").dump();
}

// dense/MoE x dp x ZeRO stage, 5 steps of tiny, default tolerances.
class VerifyGrid : public ::testing::TestWithParam<std::tuple<bool, int, int>> {};

TEST_P(VerifyGrid, MatchesTheUnshardedModel) {
  const auto [moe, dp, zero] = GetParam();
  const std::string args = "--dp " + std::to_string(dp) + " --zero " + std::to_string(zero) +
                           " --bucket-mb 0.5" + (moe ? " --experts 4 --top-k 2" : "");
  expect_matches(verify(args), args, false);
}

// dp 1 is left out: with dp = 1 (and no tp) the "sharded" run is the
// unsharded reference itself, and ZeRO over one rank changes nothing.
INSTANTIATE_TEST_SUITE_P(DenseAndMoe, VerifyGrid,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(2, 4), ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "moe" : "dense") + "_dp" +
                                  std::to_string(std::get<1>(info.param)) + "_zero" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Tensor parallelism (with and without sequence parallelism), alone and with dp and ZeRO.
class VerifyTensorParallel : public ::testing::TestWithParam<std::tuple<bool, int, bool, int, int>> {};

TEST_P(VerifyTensorParallel, MatchesTheUnshardedModel) {
  const auto [moe, tp, sp, dp, zero] = GetParam();
  const std::string args = "--tp " + std::to_string(tp) + (sp ? " --sp" : "") + " --dp " + std::to_string(dp) +
                           " --zero " + std::to_string(zero) + " --bucket-mb 0.5" + (moe ? " --experts 4 --top-k 2" : "");
  expect_matches(verify(args + " --grads"), args + " --grads", true);
}

std::string tp_name(const ::testing::TestParamInfo<std::tuple<bool, int, bool, int, int>>& info) {
  const auto [moe, tp, sp, dp, zero] = info.param;
  return std::string(moe ? "moe" : "dense") + "_tp" + std::to_string(tp) + (sp ? "_sp" : "") + "_dp" +
         std::to_string(dp) + "_zero" + std::to_string(zero);
}

INSTANTIATE_TEST_SUITE_P(
    Subset, VerifyTensorParallel,
    ::testing::Values(std::tuple{false, 2, false, 1, 0}, std::tuple{false, 4, false, 1, 0},
                      std::tuple{false, 2, true, 1, 0}, std::tuple{false, 4, true, 2, 1},
                      std::tuple{false, 2, false, 2, 2}, std::tuple{false, 2, true, 4, 2},
                      std::tuple{true, 2, false, 1, 0}, std::tuple{true, 4, true, 1, 0},
                      std::tuple{true, 2, true, 2, 1}, std::tuple{true, 4, false, 2, 2}),
    tp_name);

// ZeRO-3 (FSDP) over dp, alone and composed with TP (2D), PP and EP, with
// and without prefetch and resharding after forward, hybrid (HSDP: shard
// over pairs, replicate across), the step-0 gradients
// checked too; default tolerances (1e-5). The non-owned parameters are NaN
// between uses, so a unit used without its gather fails here.
// A test name from the flags: "--dp 2 --tp 2" -> dp_2_tp_2.
std::string flags_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name;
  for (char c : info.param)
    if (c != '-') name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class VerifyZero3 : public ::testing::TestWithParam<std::string> {};

TEST_P(VerifyZero3, MatchesTheUnshardedModel) {
  const std::string args = "--zero 3 --grads " + GetParam();
  expect_matches(verify(args), args, true);
}

INSTANTIATE_TEST_SUITE_P(
    Compositions, VerifyZero3,
    ::testing::Values("--dp 2", "--dp 4", "--dp 2 --tp 2", "--dp 2 --tp 2 --sp", "--dp 2 --pp 2 --micro-batches 2",
                      "--dp 2 --experts 4 --top-k 2 --ep 2", "--dp 4 --experts 4 --top-k 2 --ep 2",
                      "--dp 2 --no-prefetch", "--dp 2 --micro-batches 2 --no-reshard-after-forward",
                      "--dp 2 --pp 2 --micro-batches 4 --schedule zb-v", "--dp 3 --batch 6",
                      "--dp 4 --hsdp 2", "--dp 4 --hsdp 2 --tp 2",
                      // every micro-batch reduce-scattered and accumulated into the shards
                      "--dp 2 --micro-batches 4", "--dp 4 --hsdp 2 --micro-batches 2",
                      "--dp 2 --experts 4 --top-k 2 --ep 2 --micro-batches 2",
                      "--dp 2 --tp 2 --pp 2 --micro-batches 4 --schedule interleaved --vpp 2"),
    flags_name);

// --overlap-param-gather (ZeRO 1/2's gathers in the next forward): the same
// numbers as the unsharded model, over pure dp too (param_gather_test checks
// the bits against the gathers after the step).
class VerifyOverlapParamGather : public ::testing::TestWithParam<std::string> {};

TEST_P(VerifyOverlapParamGather, MatchesTheUnshardedModel) {
  const std::string args = GetParam() + " --bucket-mb 0.5 --overlap-param-gather";
  expect_matches(verify(args), args, false);
}

INSTANTIATE_TEST_SUITE_P(Compositions, VerifyOverlapParamGather,
                         ::testing::Values("--dp 2 --zero 1", "--dp 4 --zero 2", "--dp 2 --zero 2 --tp 2 --sp",
                                           "--dp 2 --zero 1 --pp 2 --micro-batches 2",
                                           "--dp 2 --zero 2 --experts 4 --top-k 2 --ep 2"),
                         flags_name);

// Context parallelism from the command line (the whole grid is
// tests/model/parallel/context/cp_verify_test.cc): the ring and the
// all-gather, composed with tp + sp, dp and pp; default tolerances.
class VerifyContextParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(VerifyContextParallel, MatchesTheUnshardedModel) {
  const std::string args = "--grads " + GetParam();
  expect_matches(verify(args), args, true);
}

INSTANTIATE_TEST_SUITE_P(Compositions, VerifyContextParallel,
                         ::testing::Values("--cp 2", "--cp 4 --cp-comm allgather", "--cp 2 --tp 2 --sp --dp 2",
                                           "--cp 2 --pp 2 --micro-batches 2"),
                         flags_name);

TEST(Verify, DataParallelNotAPowerOfTwo) {
  expect_matches(verify("--dp 3 --batch 6 --grads"), "--dp 3 --batch 6 --grads", true);
}

TEST(Verify, ACorruptedShardFailsAndIsNamed) {
  auto j = verify("--dp 2 --corrupt-shard transformer.h.2.mlp.c_fc.weight:0", 1);
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["first_mismatch"]["name"], "transformer.h.2.mlp.c_fc.weight");
  EXPECT_EQ(j["first_mismatch"]["layer"], 2);
  EXPECT_GT(j["param_rel_l2"].get<double>(), 1e-3);
  // A replica that drifts from its data-parallel peers is caught too.
  auto k = verify("--dp 2 --corrupt-shard transformer.ln_f.bias:1", 1);
  EXPECT_EQ(k["first_mismatch"]["kind"], "replica");
  EXPECT_NE(k["first_mismatch"]["name"].get<std::string>().find("transformer.ln_f.bias"), std::string::npos);
  // And the text verdict names it in one line.
  auto r = run_cli("verify --model tiny --steps 2 --dp 2 --corrupt-shard transformer.h.0.attn.c_proj.weight:0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("FAIL"), std::string::npos);
  EXPECT_NE(r.out.find("transformer.h.0.attn.c_proj.weight (layer 0)"), std::string::npos) << r.out;
}

TEST(Verify, ShardedRunsAreBitIdenticalRunToRun) {
  const std::string a = ::testing::TempDir() + "va.json", b = ::testing::TempDir() + "vb.json";
  ASSERT_EQ(run_cli("train --model tiny --steps 4 --dp 4 --zero 2 --bucket-mb 0.5 --experts 4 --report " + a).code, 0);
  ASSERT_EQ(run_cli("train --model tiny --steps 4 --dp 4 --zero 2 --bucket-mb 0.5 --experts 4 --report " + b).code, 0);
  auto ja = nlohmann::json::parse(slurp(a)), jb = nlohmann::json::parse(slurp(b));
  ASSERT_EQ(ja["steps"].size(), 4u);
  ASSERT_EQ(jb["steps"].size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_EQ(ja["steps"][s]["loss"].get<double>(), jb["steps"][s]["loss"].get<double>());
    EXPECT_EQ(ja["steps"][s]["virtual_time_s"].get<double>(), jb["steps"][s]["virtual_time_s"].get<double>());
  }
}

nlohmann::json train_report(const std::string& args) {
  const std::string path = ::testing::TempDir() + "rep.json";
  auto r = run_cli("train --model tiny --steps 3 --report " + path + " " + args);
  EXPECT_EQ(r.code, 0) << r.err;
  return nlohmann::json::parse(slurp(path));
}

TEST(DataParallel, OverlapHidesGradientReductionBehindBackward) {
  auto on = train_report("--dp 4 --bucket-mb 0.25");
  auto off = train_report("--dp 4 --bucket-mb 0.25 --no-overlap");
  const double t_on = on["summary"]["virtual_step_s"], t_off = off["summary"]["virtual_step_s"];
  const double exposed_on = on["devices"][0]["comm_s"], exposed_off = off["devices"][0]["comm_s"];
  std::printf("dp 4 step: overlap %.1f us (exposed comm %.1f us), no overlap %.1f us (exposed %.1f us)\n",
              t_on * 1e6, exposed_on * 1e6, t_off * 1e6, exposed_off * 1e6);
  EXPECT_LT(t_on, t_off);
  EXPECT_LT(exposed_on, exposed_off);
  // Same buckets, same math: identical losses.
  EXPECT_EQ(on["steps"][2]["loss"].get<double>(), off["steps"][2]["loss"].get<double>());
}

TEST(DataParallel, ZeroShrinksOptimizerStateAndGradients) {
  auto kind = [](const nlohmann::json& j, const char* k) { return j["devices"][0]["peak_bytes_by_kind"][k].get<double>(); };
  auto z0 = train_report("--dp 4 --bucket-mb 0.25");
  auto z1 = train_report("--dp 4 --bucket-mb 0.25 --zero 1");
  auto z2 = train_report("--dp 4 --bucket-mb 0.25 --zero 2");
  std::printf("optimizer bytes per device: zero0 %.0f zero1 %.0f; grad bytes zero0 %.0f zero2 %.0f\n",
              kind(z0, "optimizer"), kind(z1, "optimizer"), kind(z0, "grad"), kind(z2, "grad"));
  EXPECT_NEAR(kind(z1, "optimizer") / kind(z0, "optimizer"), 0.25, 0.01);
  EXPECT_EQ(kind(z1, "grad"), kind(z0, "grad"));
  // Exact: ZeRO-2 holds device 0's chunk of every bucket plus the largest
  // bucket while it is reduced. Buckets by hand: the tensors from the last in
  // the table to the first (the order backward finishes them, adjacent in the
  // flat buffer), a bucket closing once it holds >= 0.25 MB.
  model::GPTConfig c = model::preset("tiny");
  const auto& m = z2["config"]["model"];
  c.n_layer = m["layers"], c.n_head = m["heads"], c.n_embd = m["embd"], c.block_size = m["seq"];
  c.vocab_size = m["vocab"];
  const model::ParamTable table(c);
  std::vector<int64_t> buckets;
  int64_t open = 0;
  for (auto s = table.specs().rbegin(); s != table.specs().rend(); ++s) {
    open += s->numel;
    if (double(open) * 4 >= 0.25e6) buckets.push_back(open), open = 0;
  }
  if (open > 0) buckets.push_back(open);
  int64_t owned = 0, largest = 0;
  for (int64_t n : buckets) owned += n / 4, largest = std::max(largest, n);  // chunk 0 of 4: [0, n/4)
  const int64_t held = std::min(table.numel(), owned + largest);
  std::printf("ZeRO-2 device 0: %zu buckets, owned %lld + largest %lld = %lld of %lld gradients (%.3f)\n",
              buckets.size(), (long long)owned, (long long)largest, (long long)held, (long long)table.numel(),
              double(held) / double(table.numel()));
  EXPECT_EQ(kind(z0, "grad"), double(table.numel() * 4));
  EXPECT_EQ(kind(z2, "grad"), double(held * 4));
}

TEST(Verify, BadInputIsOneLineAndExitCode2) {
  expect_usage_error("verify --model tiny --dp 3", "--batch 8 is not divisible by --dp 3");
  expect_usage_error("verify --model tiny --zero 4", "--zero must be 0, 1, 2 or 3");
  expect_usage_error("verify --model tiny --dp 64 --batch 64", "64 devices requested but profile a100-nvlink has 32");
  expect_usage_error("verify --model tiny --heads 4 --tp 3", "--tp 3: must divide --heads 4");
  expect_usage_error("verify --model tiny --sp", "--sp needs --tp");
  expect_usage_error("verify --model tiny --tol-loss -1", "--tol-loss");
}

TEST(Pipeline, ThreeDimensionalRunMatchesAndTheTiedCopyIsChecked) {
  const std::string args = "--tp 2 --pp 2 --dp 2 --micro-batches 4 --grads";
  expect_matches(verify(args), args, true);
  // The last stage's copy of the tied wte drifting from the first stage's is caught.
  auto k = verify("--pp 2 --micro-batches 2 --corrupt-shard transformer.wte.weight:1", 1);
  EXPECT_EQ(k["first_mismatch"]["kind"], "replica");
  EXPECT_NE(k["first_mismatch"]["name"].get<std::string>().find("tied copy"), std::string::npos);
}

// Llama 3's pipeline (Dubey et al. 2024, sec. 3.3.2): the first stage holds
// only the embedding and the last only the head, with interleaving and without.
TEST(Pipeline, EndStagesWithoutBlocksMatch) {
  for (const std::string args : {"--pp 2 --vpp 2 --schedule interleaved --micro-batches 4 --pp-layers 0,2,2,0",
                                 "--pp 2 --micro-batches 2 --pp-layers 4,0", "--pp 2 --micro-batches 2 --pp-layers 0,4"})
    expect_matches(verify(args), args, false);
}

// Model chunks on one rank (interleaved with pp 1) pass activations from
// chunk to chunk on that rank, so the run is the sharded model, compared for
// real: it aborted on the activation's send ("a one-stage model sends no
// activation") until session 33, and one device was called vacuous.
TEST(Pipeline, InterleavedChunksOnOneRankMatch) {
  for (const std::string args : {"--vpp 2 --schedule interleaved --micro-batches 2 --grads",
                                 "--vpp 4 --schedule interleaved --micro-batches 4 --dp 2 --grads"}) {
    const nlohmann::json j = verify(args);
    expect_matches(j, args, true);
    EXPECT_TRUE(j.at("sharded").get<bool>()) << args;
  }
  EXPECT_FALSE(verify("").at("sharded").get<bool>());  // one device, the unsharded model itself
}

// GPipe on one rank runs every micro-batch's forward before the first
// backward, so the rank holds several micro-batches' activations: the run
// is the sharded model (the unsharded reference holds one at a time and
// aborted, "the unsharded model runs one micro-batch at a time", until
// session 34's config fuzzer, seed 101). 1F1B on one rank alternates F and B
// and stays the unsharded model.
TEST(Pipeline, GpipeOnOneRankHoldsEveryMicroBatchAndMatches) {
  for (const std::string args : {"--schedule gpipe --micro-batches 4 --grads",
                                 "--schedule gpipe --micro-batches 4 --dp 4 --zero 2 --batch 32 --grads",
                                 "--family llama --experts 2 --moe-top-k 2 --schedule gpipe --micro-batches 4 --grads"}) {
    const nlohmann::json j = verify(args);
    expect_matches(j, args, true);
    EXPECT_TRUE(j.at("sharded").get<bool>()) << args;
  }
  EXPECT_FALSE(verify("--schedule 1f1b --micro-batches 4").at("sharded").get<bool>());
}

TEST(Pipeline, BadConfigurationsAreOneLineAndExitCode2) {
  expect_usage_error("train --model tiny --pp 8", "--pp 8 is more than --layers 4");
  expect_usage_error("train --model tiny --pp 2 --vpp 2 --schedule interleaved --micro-batches 2 --layers 3",
                     "--pp 2 x --vpp 2 = 4 stages is more than --layers 3");
  expect_usage_error("train --model tiny --pp 2 --pp-layers 3,2", "--pp-layers sums to 5 but the model has --layers 4");
  expect_usage_error("train --model tiny --pp 2 --pp-layers 4", "--pp-layers has 1 entries but there are 2 stages");
  expect_usage_error("train --model tiny --pp 2 --pp-layers 3,x", "--pp-layers \"3,x\"");
  expect_usage_error("train --model tiny --pp 3 --pp-layers 2,0,2", "every stage but the first and the last needs at least one block");
  expect_usage_error("train --model tiny --pp 2 --pp-layers 5,-1", "a stage cannot hold a negative number of blocks");
  // Found by fuzzing (fuzz/corpus/pp_layers/found_sum_overflow): the sum overflowed int.
  expect_usage_error("train --model tiny --pp 2 --pp-layers 2147483647,2147483647",
                     "--pp-layers sums to 4294967294 but the model has --layers 4");
  expect_usage_error("train --model tiny --pp 4 --schedule interleaved --vpp 2 --micro-batches 6 --batch 12 --layers 8",
                     "must be a multiple of --pp 4");
  expect_usage_error("train --model tiny --pp 2 --micro-batches 3", "--batch 8 is not divisible by --micro-batches 3 x --dp 1");
  expect_usage_error("train --model tiny --pp 2 --schedule zigzag", "zigzag");
  expect_usage_error("train --model tiny --pp 2 --vpp 2", "--vpp");
  expect_usage_error("train --model tiny --pp 0", "--pp");
  expect_usage_error("train --model tiny --micro-batches 0", "--micro-batches");
}

}  // namespace
}  // namespace shardlab
