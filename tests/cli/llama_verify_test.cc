// `shardlab verify --model tiny-llama` and `--model tiny-moe`: the llama
// family (RMSNorm, SwiGLU, RoPE, GQA with 4 query heads over 2 K/V heads,
// untied head; tiny-moe with SwiGLU experts) sharded under each parallelism
// matches its unsharded model, step-0 gradients included.
// One case per parallelism here; the wider matrix is llama_verify_full_test
// (ctest label `full`). tp 2 splits K/V by heads; tp 4 replicates them and
// sums their gradients over TP; cp 2 rotates at global positions.
#include <cctype>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

// A test name from the flags: "--dp 2 --tp 2" -> dp_2_tp_2.
std::string flags_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name;
  for (char c : info.param)
    if (c != '-') name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class LlamaVerify : public ::testing::TestWithParam<std::string> {};

// Tolerances 1e-5 (verify's defaults): per-step relative loss difference,
// relative L2 of the final parameters and of the step-0 gradients. MQA
// (one K/V head) drifts more with no sharding at all: two unsharded runs
// differing only in the order of their sums end 2.6e-6 apart in parameters
// (verify's noise floor; Adam magnifies v_proj's tiny gradients), so its
// parameters get verify's own 10 x floor.
void expect_verify_passes(const std::string& args, double param_tol) {
  auto r = testing::run_cli(args);
  ASSERT_EQ(r.code, 0) << args << "\n" << r.err << r.out.substr(0, 3000);
  const auto j = nlohmann::json::parse(r.out);
  const double loss = j.at("max_loss_rel_diff").get<double>(), param = j.at("param_rel_l2").get<double>(),
               grad = j.at("grad_rel_l2").get<double>();
  std::printf("%s: max loss rel diff %.3e, parameter rel L2 %.3e (tolerance %.0e), step-0 gradient rel L2 %.3e "
              "(tolerances 1e-5)\n",
              args.c_str(), loss, param, param_tol, grad);
  EXPECT_TRUE(j.at("passed").get<bool>());
  EXPECT_LE(loss, 1e-5);
  EXPECT_LE(param, param_tol);
  EXPECT_LE(grad, 1e-5);
  EXPECT_TRUE(j.at("first_mismatch").is_null()) << j.at("first_mismatch").dump();
}

TEST_P(LlamaVerify, MatchesTheUnshardedModel) {
  const double param_tol = GetParam().find("--kv-heads 1") != std::string::npos ? 3e-5 : 1e-5;
  expect_verify_passes("verify --model tiny-llama --steps 4 --json --grads " + GetParam(), param_tol);
}

// tiny-moe: SwiGLU experts (8 routed of 64, top-2, 1 shared, block 0 dense)
// over tiny-llama's attention. TP splits gate/up column-parallel and down
// row-parallel in every expert, routed and shared; EP exchanges the tokens.
// Tolerances 1e-5 as above. With --router-bias-rate the parameters compared
// include every block's selection bias.
class LlamaMoeVerify : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaMoeVerify, MatchesTheUnshardedModel) {
  expect_verify_passes("verify --model tiny-moe --steps 3 --json --grads " + GetParam(), 1e-5);
}

#ifndef SHARDLAB_LLAMA_VERIFY_FULL
INSTANTIATE_TEST_SUITE_P(OnePerParallelism, LlamaVerify,
                         ::testing::Values("--tp 2", "--tp 4", "--tp 2 --sp", "--pp 2 --micro-batches 2",
                                           "--dp 2 --zero 1", "--dp 2 --zero 3", "--cp 2",
                                           "--tp 2 --pp 2 --dp 2 --zero 1 --micro-batches 2",
                                           // ZeRO-3 reduces every micro-batch, but K/V held whole on every
                                           // TP rank and the tied wte's pipeline copies once (final_only)
                                           "--tp 4 --dp 2 --zero 3 --micro-batches 2",
                                           "--tie-embeddings --pp 2 --dp 2 --zero 3 --micro-batches 2",
                                           // ZeRO-2 too (DeepSpeed's stage 2), with the same final-only buckets
                                           "--tp 4 --dp 2 --zero 2 --micro-batches 2",
                                           "--tie-embeddings --pp 2 --dp 2 --zero 2 --micro-batches 2"),
                         flags_name);
// One case per parallelism and the 5D mix on 32 virtual GPUs.
INSTANTIATE_TEST_SUITE_P(OnePerParallelism, LlamaMoeVerify,
                         ::testing::Values("--tp 2", "--tp 4 --sp", "--ep 2 --dp 2", "--dp 2 --zero 3",
                                           "--pp 2 --micro-batches 2", "--cp 2", "--tp 2 --recompute full",
                                           "--tp 2 --cp 2 --ep 2 --dp 4 --pp 2",
                                           "--router-bias-rate 0.01 --tp 2 --ep 2 --dp 2 --pp 2 --micro-batches 2",
                                           // aux-loss-free (as deepseek-v3): each replica routes its own tokens
                                           "--aux-coef 0 --router-bias-rate 0.01 --ep 2 --dp 2 --pp 2 --micro-batches 2",
                                           "--aux-coef 0 --router-bias-rate 0.01 --dp 2 --zero 1",
                                           // ZeRO-2 every micro-batch: expert buckets summed over edp each time
                                           "--ep 2 --dp 2 --zero 2 --micro-batches 2",
                                           // group-limited routing (deepseek-v3's node limit): 2 of 4 groups
                                           "--moe-groups 4 --moe-group-top-k 2 --moe-router sigmoid --tp 2 --ep 2 --dp 2"),
                         flags_name);

nlohmann::json generate(const std::string& args) {
  const auto r = testing::run_cli("generate --model tiny-llama --json " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

// Generation with RoPE at each cached position and a KV cache of K/V heads:
// the same tokens unsharded, with K/V split (tp 2), replicated (tp 4) and
// over pipeline stages, greedy and sampled. The cache holds K and V of every
// layer for the K/V heads a rank's query heads read: tiny-llama has 4 layers
// and 2 K/V heads of 32, here 5 + 8 - 1 = 12 cached tokens in fp32.
TEST(LlamaGenerate, TokensAreTheSameUnderEverySplitAndTheCacheIsSizedByKvHeads) {
  const std::string args = "--prompt-tokens 5,6,7,8,9 --max-new-tokens 8 --seed 4 ";
  for (const std::string sampling : {"", "--temperature 0.8 --top-k 16"}) {
    const nlohmann::json base = generate(args + sampling);
    ASSERT_TRUE(base.contains("tokens"));
    EXPECT_EQ(base["tokens"].size(), 8u);
    for (const std::string split : {"--tp 2", "--tp 4", "--pp 2", "--tp 2 --pp 2"})
      EXPECT_EQ(generate(args + sampling + " " + split)["tokens"], base["tokens"]) << split << " " << sampling;
  }
  const uint64_t per_head = 2u * 4 * 32 * 12 * 4;  // K and V, 4 layers, head size 32, 12 tokens, 4 bytes
  EXPECT_EQ(generate(args)["devices"][0]["kv_cache_bytes"].get<uint64_t>(), 2 * per_head);  // both K/V heads
  EXPECT_EQ(generate(args + "--tp 2")["devices"][0]["kv_cache_bytes"].get<uint64_t>(), per_head);
  // tp 4 replicates the 2 K/V heads' projection, but each rank's one query
  // head reads one of them: that one is all it caches.
  EXPECT_EQ(generate(args + "--tp 4")["devices"][0]["kv_cache_bytes"].get<uint64_t>(), per_head);
}
#else
INSTANTIATE_TEST_SUITE_P(
    Matrix, LlamaVerify,
    ::testing::Values("--tp 4 --sp", "--tp 4 --dp 2 --zero 2", "--tp 2 --dp 2 --zero 3", "--tp 4 --dp 2 --zero 3",
                      "--dp 2 --zero 2", "--dp 4 --zero 1", "--pp 2 --micro-batches 4 --schedule gpipe",
                      "--pp 2 --micro-batches 4 --schedule 1f1b", "--pp 2 --vpp 2 --micro-batches 4 --schedule interleaved",
                      "--pp 2 --micro-batches 4 --schedule zb-h1", "--pp 2 --micro-batches 4 --schedule zb-h2",
                      "--pp 2 --micro-batches 4 --schedule zb-v", "--pp 2 --micro-batches 4 --schedule dualpipev",
                      "--pp 4 --micro-batches 4", "--tp 2 --recompute selective", "--tp 4 --recompute full",
                      "--cp 2 --tp 2", "--cp 2 --tp 4", "--cp 4", "--cp 2 --cp-comm allgather", "--cp 2 --dp 2 --zero 3",
                      "--tp 2 --sp --pp 2 --dp 2 --zero 3 --micro-batches 2", "--tp 4 --sp --cp 2 --pp 2 --micro-batches 2",
                      "--kv-heads 1 --tp 2", "--kv-heads 1 --tp 4 --sp", "--kv-heads 4 --tp 4", "--tie-embeddings --pp 2 --micro-batches 2",
                      "--tie-embeddings --tp 2 --dp 2 --zero 3"),
    flags_name);
INSTANTIATE_TEST_SUITE_P(
    Matrix, LlamaMoeVerify,
    ::testing::Values("--tp 4", "--tp 2 --sp --ep 2 --dp 2", "--ep 4 --dp 4", "--ep 2 --dp 4 --zero 1",
                      "--ep 2 --dp 2 --zero 2", "--tp 2 --dp 2 --zero 3", "--pp 2 --micro-batches 4 --schedule 1f1b",
                      "--pp 2 --vpp 2 --micro-batches 4 --schedule interleaved",
                      "--pp 2 --micro-batches 4 --schedule zb-h1", "--pp 2 --micro-batches 4 --schedule zb-v",
                      "--pp 2 --micro-batches 4 --schedule dualpipev", "--pp 4 --micro-batches 4",
                      "--tp 2 --recompute selective", "--ep 2 --dp 2 --recompute full", "--cp 2 --tp 2",
                      "--cp 2 --ep 2 --dp 2", "--cp 4", "--tp 2 --sp --pp 2 --ep 2 --dp 2 --zero 1 --micro-batches 2",
                      "--tp 4 --cp 2 --ep 2 --dp 2 --pp 2", "--router sigmoid --tp 2 --ep 2 --dp 2",
                      "--router sigmoid --no-moe-norm-topk --cp 2 --pp 2",
                      // aux-loss-free balancing: the load signal summed over dp, cp and micro-batches
                      "--router-bias-rate 0.01 --tp 2 --sp", "--router-bias-rate 0.01 --ep 2 --dp 2",
                      "--router-bias-rate 0.01 --dp 2 --zero 3", "--router-bias-rate 0.01 --cp 2",
                      "--router-bias-rate 0.01 --pp 2 --micro-batches 4 --schedule zb-h1",
                      "--router-bias-rate 0.01 --ep 2 --dp 2 --recompute full",
                      "--router-bias-rate 0.01 --tp 2 --cp 2 --ep 2 --dp 4 --pp 2",
                      // (with a sigmoid router this 5D mix ends 1.2e-5 apart in parameters, all of it
                      // embed_tokens rows that Adam moves by lr on near-zero gradients; losses, biases
                      // and step-0 gradients match: the sigmoid router is checked on fewer GPUs)
                      "--router sigmoid --router-bias-rate 0.01 --cp 2 --ep 2 --dp 2"),
    flags_name);
#endif

}  // namespace
}  // namespace shardlab
