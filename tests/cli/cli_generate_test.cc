// `shardlab generate` from the command line: the same tokens under every
// split (greedy and sampled) from a trained checkpoint, its JSON (KV bytes by
// the formula, TTFT and TPOT), and bad input as one line with exit 2.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

std::string dir() {
  static const std::string d = [] {
    const std::string p = ::testing::TempDir() + "generate_" + std::to_string(getpid());
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

// A nano model trained on the counting task (and an MoE one), saved once.
std::string checkpoint(bool moe) {
  const std::string path = dir() + (moe ? "/moe.safetensors" : "/dense.safetensors");
  if (!std::filesystem::exists(path)) {
    const testing::CliResult r = run_cli("train --model nano --data synthetic:counting --steps 60 --lr 3e-3 --json " +
                                         std::string(moe ? "--experts 4 " : "") + "--save " + path);
    EXPECT_EQ(r.code, 0) << r.err;
  }
  return path;
}

nlohmann::json generate(const std::string& args) {
  const testing::CliResult r = run_cli("generate --json " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(CliGenerate, TokensAreTheSameUnderEverySplit) {
  const std::string init = "--model nano --init " + checkpoint(false) + " --prompt-tokens 7,8,9 --max-new-tokens 10 ";
  for (const std::string sampling : {"", "--temperature 0.9 --top-k 8 --seed 5", "--temperature 1.5 --top-p 0.8 --seed 6"}) {
    const nlohmann::json base = generate(init + sampling);
    ASSERT_TRUE(base.contains("tokens"));
    for (const std::string split : {"--tp 2", "--pp 2", "--tp 2 --pp 2"})
      EXPECT_EQ(generate(init + sampling + " " + split)["tokens"], base["tokens"]) << split << " " << sampling;
  }
  // The model learned to count: greedy continues the run.
  EXPECT_EQ(generate(init)["tokens"], nlohmann::json({10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
}

// The published presets are served in bf16 unless --precision says otherwise;
// the toy ones in fp32.
TEST(CliGenerate, PublishedPresetsDefaultToBf16) {
  const std::string ids = " --phantom --prompt-tokens 1,2,3 --max-new-tokens 2";
  for (const auto& [flags, precision] : {std::pair{"--model gpt3-1.3b", "(bf16)"}, std::pair{"--model nano", "(fp32)"},
                                         std::pair{"--model gpt3-1.3b --precision fp32", "(fp32)"}}) {
    const testing::CliResult r = run_cli(std::string("generate ") + flags + ids);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find(precision), std::string::npos) << flags << "\n" << r.out;
  }
}

TEST(CliGenerate, MoeTokensAreTheSameUnderExpertParallelism) {
  const std::string init = "--model nano --experts 4 --init " + checkpoint(true) +
                           " --prompt-tokens 3,4,5 --max-new-tokens 8 ";
  for (const std::string sampling : {"", "--temperature 1 --seed 3"}) {
    const nlohmann::json base = generate(init + sampling);
    EXPECT_EQ(generate(init + sampling + " --ep 2")["tokens"], base["tokens"]) << sampling;
    EXPECT_EQ(generate(init + sampling + " --ep 2 --tp 2")["tokens"], base["tokens"]) << sampling;
  }
}

TEST(CliGenerate, JsonReportsTimesAndTheKvCachePerDevice) {
  const nlohmann::json j = generate("--model nano --prompt-tokens 1,2,3,4 --max-new-tokens 6 --tp 2 --pp 2 --precision bf16");
  ASSERT_EQ(j["devices"].size(), 4u);
  EXPECT_GT(j["ttft_s"].get<double>(), 0);
  ASSERT_EQ(j["decode_step_s"].size(), 5u);
  // TPOT is the mean decode step; each step attends over one more cached
  // token than the one before, so it takes longer.
  double sum = 0, before = 0;
  for (double step : j["decode_step_s"]) {
    EXPECT_GT(step, before) << j["decode_step_s"];
    sum += step, before = step;
  }
  EXPECT_NEAR(j["tpot_s"].get<double>(), sum / 5, 1e-15);
  // nano: 2 layers, 2 heads of 32; pp 2 -> 1 layer, tp 2 -> 1 head; 4 + 6 - 1 tokens; bf16
  for (const auto& d : j["devices"]) {
    EXPECT_EQ(d["kv_cache_bytes"].get<uint64_t>(), 2u * 1 * 1 * 32 * 9 * 2);
    EXPECT_EQ(d["peak_bytes_by_kind"]["kv_cache"].get<uint64_t>(), 2u * 1 * 1 * 32 * 9 * 2);
  }
  EXPECT_EQ(j["init"], nullptr);
}

TEST(CliGenerate, TextOutputSaysWhatItRan) {
  const testing::CliResult r = run_cli("generate --model nano --prompt-tokens 1,2,3 --max-new-tokens 4 --seed 9");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("no --init: weights randomly initialised from --seed 9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TTFT"), std::string::npos);
  EXPECT_NE(r.out.find("TPOT"), std::string::npos);
  EXPECT_NE(r.out.find("kv cache"), std::string::npos);
}

TEST(CliGenerate, PhantomTimesA13BModel) {
  const nlohmann::json j = generate("--model gpt3-13b --phantom --precision bf16 --tp 8 --prompt-tokens 1,2,3,4 "
                                    "--max-new-tokens 3");
  ASSERT_EQ(j["devices"].size(), 8u);
  EXPECT_GT(j["tpot_s"].get<double>(), 1e-3);  // 13B at bf16 over 8 A100s: milliseconds per token
  // 40 layers, 40 heads / 8 of 128, 4 + 3 - 1 tokens, bf16
  EXPECT_EQ(j["devices"][0]["kv_cache_bytes"].get<uint64_t>(), 2u * 40 * 5 * 128 * 6 * 2);
}

// DeepSeek-V3 (multi-head latent attention, 256 routed experts) on 16 H200s
// in bf16: the latent cache is (512 + 64) values a token and layer on every
// tp rank, and a decode step reads the weights of the token's 8 experts and
// the shared one only (grouped expert kernels); README "Generation" and
// "Expert parallelism (MoE)" quote these.
TEST(CliGenerate, PhantomDeepSeekV3KeepsLatentRows) {
  const nlohmann::json j = generate("--model deepseek-v3 --profile h200-nvlink --nodes 2 --tp 8 --pp 2 --phantom "
                                    "--prompt-tokens 1,2,3,4 --max-new-tokens 8");
  ASSERT_EQ(j["devices"].size(), 16u);
  // 61 layers over pp 2: 31 and 30; 4 + 8 - 1 tokens; 2 bytes
  for (int rank = 0; rank < 16; ++rank)
    EXPECT_EQ(j["devices"][size_t(rank)]["kv_cache_bytes"].get<uint64_t>(),
              uint64_t(rank < 8 ? 31 : 30) * (512 + 64) * 11 * 2)
        << rank;
  std::printf("deepseek-v3 on 16 H200s: TTFT %.4f ms, TPOT %.4f ms\n", j["ttft_s"].get<double>() * 1e3,
              j["tpot_s"].get<double>() * 1e3);
  EXPECT_NEAR(j["tpot_s"].get<double>() * 1e3, 11.235, 5e-4);
  // An FP8 latent cache (FlashMLA's): the same rows at 1 B.
  const nlohmann::json f = generate("--model deepseek-v3 --profile h200-nvlink --nodes 2 --tp 8 --pp 2 --phantom "
                                    "--prompt-tokens 1,2,3,4 --max-new-tokens 8 --kv-cache-dtype fp8");
  for (int rank = 0; rank < 16; ++rank)
    EXPECT_EQ(f["devices"][size_t(rank)]["kv_cache_bytes"].get<uint64_t>(),
              uint64_t(rank < 8 ? 31 : 30) * (512 + 64) * 11 * 1)
        << rank;
}

// Llama 3 70B on 4 H100s (tp 4), a 1,000-token prompt: an FP8 checkpoint
// (vLLM's W8A8) holds the blocks' linears at 1 B a weight, so every rank
// holds 80 x (q, k, v, o, gate, up, down) / 4 bytes fewer, counted here; its
// GEMMs read half the bytes at twice the peak, so decode (memory-bound)
// and prefill both get faster, less each linear's quantization kernel.
TEST(CliGenerate, PhantomLlama3_70bInFp8HoldsItsLinearsAtOneByte) {
  std::string prompt;
  for (int i = 0; i < 1000; ++i) prompt += (i ? "," : "") + std::to_string(i % 1000 + 1);
  const std::string run = "--model llama3-70b --profile h100-nvlink --tp 4 --phantom --max-new-tokens 8 "
                          "--prompt-tokens " + prompt;
  const nlohmann::json bf16 = generate(run + " --precision bf16"), fp8 = generate(run + " --precision fp8");
  const uint64_t C = 8192, KV = 8 * 128, F = 28672;
  const uint64_t linears = 80 * (C * C + 2 * KV * C + C * C + 2 * F * C + F * C) / 4;
  for (size_t rank = 0; rank < 4; ++rank) {
    const auto param = [&](const nlohmann::json& j) {
      return j["devices"][rank]["peak_bytes_by_kind"]["param"].get<uint64_t>();
    };
    EXPECT_EQ(param(bf16) - param(fp8), linears) << rank;
    EXPECT_EQ(fp8["devices"][rank]["kv_cache_bytes"], bf16["devices"][rank]["kv_cache_bytes"]) << rank;
  }
  for (const nlohmann::json* j : {&bf16, &fp8})
    std::printf("llama3-70b on 4 H100s: TTFT %.4f ms, TPOT %.4f ms\n", (*j)["ttft_s"].get<double>() * 1e3,
                (*j)["tpot_s"].get<double>() * 1e3);
  EXPECT_NEAR(bf16["ttft_s"].get<double>() * 1e3, 90.978, 5e-4);
  EXPECT_NEAR(bf16["tpot_s"].get<double>() * 1e3, 17.651, 5e-4);
  EXPECT_NEAR(fp8["ttft_s"].get<double>() * 1e3, 64.343, 5e-4);
  EXPECT_NEAR(fp8["tpot_s"].get<double>() * 1e3, 13.257, 5e-4);
  // An FP8 KV cache: 80 layers x 2 x 2 K/V heads of 128 a rank x 1,007 tokens x 1 B.
  const nlohmann::json kv8 = generate(run + " --precision fp8 --kv-cache-dtype fp8");
  for (size_t rank = 0; rank < 4; ++rank)
    EXPECT_EQ(kv8["devices"][rank]["kv_cache_bytes"].get<uint64_t>(), 80u * 2 * 2 * 128 * 1007) << rank;
}

TEST(CliGenerate, BadInputIsOneLineAndExitTwo) {
  std::ofstream(dir() + "/prompt.txt") << "1, 2,x\n";
  const std::string nano = "generate --model nano ";
  const std::vector<std::pair<std::string, std::string>> rows = {
      {nano + "--prompt-tokens 1,2 --max-new-tokens 31", "exceeds the model's block size 32"},
      {nano + "--prompt-tokens 1,x", "--prompt-tokens: \"x\" is not a token id"},
      {nano + "--prompt-tokens -1", "is not a token id"},
      {nano + "--prompt-tokens 256", "outside the vocabulary [0, 256)"},
      {nano + "--max-new-tokens 4", "exactly one of --prompt-tokens"},
      {nano + "--prompt-tokens 1 --prompt-file " + dir() + "/prompt.txt", "exactly one of --prompt-tokens"},
      {nano + "--prompt-file " + dir() + "/missing.txt", "missing.txt: no such file"},
      {nano + "--prompt-file " + dir(), ": is a directory, not a text file"},
      {nano + "--prompt-tokens 1,,2", "--prompt-tokens: an empty token id after id 1"},
      {nano + "--prompt-tokens ,1", "--prompt-tokens: an empty token id after id 0"},
      {nano + "--prompt-tokens 1,2,", "--prompt-tokens: an empty token id after id 2"},
      {nano + "--prompt-tokens ' , '", "--prompt-tokens: an empty token id after id 0"},
      {nano + "--prompt-file " + dir() + "/prompt.txt", "\"x\" is not a token id"},
      {nano + "--prompt-tokens 1 --max-new-tokens 0", "--max-new-tokens: 0 is out of range"},
      {nano + "--prompt-tokens 1 --temperature -1", "--temperature: -1 is out of range"},
      {nano + "--prompt-tokens 1 --temperature nan", "--temperature"},
      {nano + "--prompt-tokens 1 --top-k -2", "--top-k: -2 is out of range"},
      {nano + "--prompt-tokens 1 --top-k 5", "--top-k 5 filters sampling: it needs --temperature above 0"},
      {nano + "--prompt-tokens 1 --top-p 0.5", "--top-p 0.5 filters sampling: it needs --temperature above 0"},
      {nano + "--prompt-tokens 1 --temperature 1 --top-p 0", "--top-p must be in (0, 1]"},
      {nano + "--prompt-tokens 1 --top-p 1.5", "--top-p: 1.5 is out of range"},
      {nano + "--prompt-tokens 1 --batch 4", "--batch"},  // training's flags: not generate's
      {nano + "--prompt-tokens 1 --aux-coef 0.1", "--aux-coef"},
      {nano + "--prompt-tokens 1 --dropout 0.1", "--dropout"},
      {nano + "--prompt-tokens 1 --tp 3", "--tp"},
      {nano + "--prompt-tokens 1 --ep 2", "--ep"},
      {nano + "--prompt-tokens 1 --pp 3", "--pp"},
      {nano + "--prompt-tokens 1 --precision fp4", "--precision: unknown \"fp4\""},
      {nano + "--prompt-tokens 1 --precision fp8", "no FP8 peak"},  // nano runs on a100-nvlink
      {nano + "--prompt-tokens 1 --kv-cache-dtype e4m3", "--kv-cache-dtype: unknown \"e4m3\" (auto, fp8)"},
      {nano + "--prompt-tokens 1 --memory 0", "--memory 0"},
      {nano + "--prompt-tokens 1 --init " + dir() + "/missing.safetensors", "missing.safetensors"},
      {"generate --model tiny --prompt-tokens 1 --init " + checkpoint(false), "--init"},
      {nano + "--prompt-tokens 1 --phantom --init " + checkpoint(false), "takes no --init"},
      {nano + "--prompt-tokens 1 --trace " + dir(), "--trace"},
      {nano + "--prompt-tokens 1 --bogus", "--bogus"},
      {nano + "--prompt-tokens 1 --memory 100KiB", "out of memory allocating 'parameters'"},
  };
  for (const auto& [args, needle] : rows) {
    expect_usage_error(args, needle);
  }
}

}  // namespace
}  // namespace shardlab
