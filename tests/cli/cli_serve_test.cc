// shardlab serve from the command line: its report and its bad inputs.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <unistd.h>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/serve_cli_util.h"
#include "tests/support/cli_util.h"

namespace shardlab::testing {
namespace {

const std::string kServe = "serve --model tiny --layers 2 --requests 12 --prompt-len uniform:4:20 --output-len uniform:1:8 ";

TEST(CliServe, JsonSummaryCountsEveryRequest) {
  const CliResult r = run_cli(kServe + "--arrival poisson:200 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& s = j["summary"];
  EXPECT_EQ(s["requests"].get<int>(), 12);
  EXPECT_GT(s["ttft_s"]["p50"].get<double>(), 0);
  EXPECT_LE(s["ttft_s"]["p50"].get<double>(), s["ttft_s"]["p99"].get<double>());
  EXPECT_LE(s["ttft_s"]["p99"].get<double>(), s["e2e_s"]["max"].get<double>());
  // The capacity is the plan's blocks times the block size.
  EXPECT_EQ(s["kv_capacity_tokens_per_replica"].get<int64_t>(), j["scheduler"]["kv_blocks"].get<int64_t>() * 16);
  EXPECT_EQ(j["replica_devices"].size(), 1u);
}

// A burst whose requests need 16 x 16 blocks of 4 tokens at their end, on a
// cache of 214 (4 MiB less the weights and a step's activations): continuous
// batching preempts and
// still finishes everything; the report lists every request and step.
TEST(CliServe, ATightCachePreemptsAndTheReportHasEveryRequest) {
  const std::string report = ::testing::TempDir() + "serve_report.json";
  const CliResult r = run_cli(
      "serve --model tiny --layers 2 --requests 16 --arrival burst --prompt-len 24 --output-len 40 --kv-block 4 "
      "--max-batch-tokens 64 --max-seqs 16 --memory 4MiB --kv-fraction 1 --report " + report);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(report));
  EXPECT_EQ(j["requests"].size(), 16u);
  EXPECT_EQ(j["usage"].size(), j["summary"]["steps"].get<size_t>());
  const int64_t blocks = j["scheduler"]["kv_blocks"].get<int64_t>();
  for (const auto& u : j["usage"]) ASSERT_LE(u["used_blocks"].get<int64_t>(), blocks);
  std::printf("%lld blocks, %lld preemptions\n", (long long)blocks, (long long)j["summary"]["preemptions"].get<int64_t>());
  EXPECT_GT(j["summary"]["preemptions"].get<int64_t>(), 0);
  EXPECT_NE(r.out.find("preemptions"), std::string::npos);
}

TEST(CliServe, ContinuousBatchingBeatsStaticOnABurst) {
  auto throughput = [](const std::string& batching) {
    const CliResult r = run_cli(kServe + "--arrival burst --max-seqs 4 --json --batching " + batching);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out)["summary"]["output_tokens_per_s"].get<double>();
  };
  const double c = throughput("continuous"), s = throughput("static");
  std::printf("burst: continuous %.1f tokens/s, static %.1f tokens/s\n", c, s);
  EXPECT_GT(c, s);  // static waits for each batch's longest request
}

// On the model's values, with ten requests at once on a cache that makes
// them preempt and chunks of 8 prefill tokens, every request's tokens in the
// report are what `generate` gives its prompt alone; the counting model
// counts on from each prompt's last token.
TEST(CliServe, EveryRequestGetsGeneratesTokens) {
  const std::string init = "--model nano --init " + counting_checkpoint();
  for (const std::string split : {"--tp 2 --memory 380KiB", "--pp 2 --memory 460KiB"}) {
    const std::string report = ::testing::TempDir() + "serve_values_report.json";
    const CliResult r = run_cli("serve " + init + " " + split + " --requests 10 --arrival burst --prompt-len uniform:4:16 "
                                "--output-len uniform:8:16 --kv-block 4 --max-batch-tokens 32 --max-seqs 10 "
                                "--chunked-prefill 8 --kv-fraction 1 --report " + report);
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(slurp(report));
    std::printf("%s: %lld preemptions\n", split.c_str(), (long long)j["summary"]["preemptions"].get<int64_t>());
    EXPECT_GT(j["summary"]["preemptions"].get<int64_t>(), 0) << split;
    EXPECT_FALSE(j["phantom"].get<bool>());
    int counting = 0;
    for (const auto& q : j["requests"]) {
      ASSERT_EQ(q["prompt_tokens"].size(), q["prompt_len"].get<size_t>());
      ASSERT_EQ(q["tokens"].size(), q["output_len"].get<size_t>());
      const CliResult g = run_cli("generate --json " + init + " --prompt-tokens " + joined(q["prompt_tokens"]) +
                                  " --max-new-tokens " + std::to_string(q["output_len"].get<int>()));
      ASSERT_EQ(g.code, 0) << g.err;
      EXPECT_EQ(q["tokens"], nlohmann::json::parse(g.out)["tokens"]) << split << ", request " << q["id"];
      counting += q["tokens"][0].get<int>() == q["prompt_tokens"].back().get<int>() + 1;
    }
    EXPECT_GE(counting, 8) << "the model learned to count";
  }
}

// Sampled serving: request i draws what generate draws with --seed S + i,
// under pp 2 with preemptions as above.
TEST(CliServe, SampledRequestsGetGeneratesTokensWithSeedPlusId) {
  const std::string init = "--model nano --init " + counting_checkpoint();
  const std::string sampling = " --temperature 1.5 --top-k 30 --top-p 0.95";
  const std::string report = ::testing::TempDir() + "serve_sampled_report.json";
  const CliResult r = run_cli("serve " + init + sampling + " --seed 40 --pp 2 --memory 460KiB --requests 6 "
                              "--arrival burst --prompt-len uniform:4:16 --output-len uniform:8:16 --kv-block 4 "
                              "--max-batch-tokens 32 --max-seqs 10 --chunked-prefill 8 --kv-fraction 1 --report " + report);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(report));
  EXPECT_EQ(j["sampling"]["seed"].get<int>(), 40);
  int not_greedy = 0;
  for (const auto& q : j["requests"]) {
    const int id = q["id"].get<int>();
    const std::string prompt = " --prompt-tokens " + joined(q["prompt_tokens"]) + " --max-new-tokens " +
                               std::to_string(q["output_len"].get<int>());
    const CliResult g = run_cli("generate --json " + init + sampling + " --seed " + std::to_string(40 + id) + prompt);
    const CliResult greedy = run_cli("generate --json " + init + prompt);
    ASSERT_EQ(g.code, 0) << g.err;
    ASSERT_EQ(greedy.code, 0) << greedy.err;
    EXPECT_EQ(q["tokens"], nlohmann::json::parse(g.out)["tokens"]) << "request " << id;
    not_greedy += q["tokens"] != nlohmann::json::parse(greedy.out)["tokens"];
  }
  std::printf("%d of 6 requests sampled tokens other than greedy's\n", not_greedy);
  EXPECT_GT(not_greedy, 0) << "the sampling flags reached the serving run";
}

// A workload file may give the prompts' ids: they are the ones served.
TEST(CliServe, WorkloadPromptTokensAreServed) {
  const std::string init = "--model nano --init " + counting_checkpoint();
  const std::string workload = ::testing::TempDir() + "serve_ids.csv";
  std::ofstream(workload) << "arrival_s,prompt_len,output_len,prompt_tokens\n0,3,5,40 41 42\n0.0001,4,3,7 100 8 9\n";
  const std::string report = ::testing::TempDir() + "serve_ids_report.json";
  const CliResult r = run_cli("serve " + init + " --tp 2 --workload " + workload + " --report " + report);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("prompts from --workload"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(report));
  ASSERT_EQ(j["requests"].size(), 2u);
  EXPECT_EQ(j["requests"][0]["prompt_tokens"], nlohmann::json({40, 41, 42}));
  EXPECT_EQ(j["requests"][1]["prompt_tokens"], nlohmann::json({7, 100, 8, 9}));
  for (const auto& q : j["requests"]) {
    const CliResult g = run_cli("generate --json " + init + " --prompt-tokens " + joined(q["prompt_tokens"]) +
                                " --max-new-tokens " + std::to_string(q["output_len"].get<int>()));
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(q["tokens"], nlohmann::json::parse(g.out)["tokens"]) << "request " << q["id"];
  }
}

// Prefix caching on values: eight requests whose prompts share 16 tokens
// (a system prompt), arriving about 20 ms apart; with the cache each one
// after the first finds the prefix's 4 blocks (16 of its 16 + 8 tokens),
// its TTFT drops, and its tokens are generate's.
TEST(CliServe, PrefixCachingSkipsTheSharedPromptAndKeepsTheTokens) {
  const std::string init = "--model nano --init " + counting_checkpoint();
  const std::string flags = "serve " + init + " --requests 8 --arrival poisson:50 --shared-prefix 16 --prompt-len 8 "
                            "--output-len 6 --kv-block 4 --json";
  const std::string report = ::testing::TempDir() + "serve_prefix_report.json";
  const CliResult off = run_cli(flags), on = run_cli(flags + " --prefix-caching --report " + report);
  ASSERT_EQ(off.code, 0) << off.err;
  ASSERT_EQ(on.code, 0) << on.err;
  const nlohmann::json a = nlohmann::json::parse(off.out)["summary"], b = nlohmann::json::parse(on.out)["summary"];
  EXPECT_EQ(b["prefix_cache"]["hit_tokens"].get<int64_t>(), 7 * 16);
  EXPECT_EQ(b["prefix_cache"]["query_tokens"].get<int64_t>(), 8 * 24);
  std::printf("TTFT mean %.3f ms without, %.3f ms with prefix caching\n", a["ttft_s"]["mean"].get<double>() * 1e3,
              b["ttft_s"]["mean"].get<double>() * 1e3);
  EXPECT_LT(b["ttft_s"]["mean"].get<double>(), a["ttft_s"]["mean"].get<double>());
  const nlohmann::json j = nlohmann::json::parse(slurp(report));
  for (const auto& q : j["requests"]) {
    EXPECT_EQ(q["cached_tokens"].get<int>(), q["id"].get<int>() == 0 ? 0 : 16);
    const CliResult g = run_cli("generate --json " + init + " --prompt-tokens " + joined(q["prompt_tokens"]) +
                                " --max-new-tokens " + std::to_string(q["output_len"].get<int>()));
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(q["tokens"], nlohmann::json::parse(g.out)["tokens"]) << "request " << q["id"];
  }
}

// Greedy speculative decoding from the command line: the counting model as
// its own draft (--draft-init) has every proposal accepted, and the tokens
// are generate's; a phantom run at accept=1 likewise accepts every draft.
TEST(CliServe, SpeculativeDecodingKeepsTheTokens) {
  const std::string ckpt = counting_checkpoint(), init = "--model nano --init " + ckpt;
  const std::string report = ::testing::TempDir() + "serve_spec_report.json";
  const CliResult r = run_cli("serve " + init + " --tp 2 --requests 4 --arrival burst --prompt-len 6 --output-len 12 "
                              "--speculative draft=nano,k=4 --draft-init " + ckpt + " --report " + report);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Speculative decoding"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(report));
  const nlohmann::json& sp = j["summary"]["speculative"];
  EXPECT_GT(sp["drafts_proposed"].get<int64_t>(), 0);
  EXPECT_EQ(sp["drafts_accepted"], sp["drafts_proposed"]);
  for (const auto& q : j["requests"]) {
    const CliResult g = run_cli("generate --json " + init + " --prompt-tokens " + joined(q["prompt_tokens"]) +
                                " --max-new-tokens 12");
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(q["tokens"], nlohmann::json::parse(g.out)["tokens"]) << "request " << q["id"];
  }
  const CliResult p = run_cli(kServe + "--phantom --json --speculative draft=tiny,k=3,accept=1");
  ASSERT_EQ(p.code, 0) << p.err;
  const nlohmann::json ps = nlohmann::json::parse(p.out)["summary"]["speculative"];
  EXPECT_EQ(ps["drafts_accepted"], ps["drafts_proposed"]);
}

// The same steps on shapes only take the same virtual times.
TEST(CliServe, PhantomTimesEqualTheValuesRun) {
  const std::string flags = kServe + "--arrival poisson:200 --chunked-prefill 8 --tp 2 --pp 2 --json";
  const CliResult values = run_cli(flags), phantom = run_cli(flags + " --phantom");
  ASSERT_EQ(values.code, 0) << values.err;
  ASSERT_EQ(phantom.code, 0) << phantom.err;
  EXPECT_EQ(nlohmann::json::parse(values.out)["summary"], nlohmann::json::parse(phantom.out)["summary"]);
  EXPECT_TRUE(nlohmann::json::parse(phantom.out)["phantom"].get<bool>());
}

// --phantom folds the tp peers of a dense model (one thread per stage) and
// changes no figure: the summary and the plan equal the unfolded run's.
TEST(CliServe, FoldedPhantomRunEqualsTheUnfoldedOne) {
  const std::tuple<std::string, int, int> cases[] = {{"--tp 4", 1, 4}, {"--tp 2 --pp 2 --replicas 2", 2, 4}};
  for (const auto& [split, folded_threads, devices] : cases) {
    const std::string flags = kServe + "--arrival poisson:200 --chunked-prefill 8 --phantom --json " + split;
    const CliResult folded = run_cli(flags), unfolded = run_cli(flags + " --no-fold");
    ASSERT_EQ(folded.code, 0) << folded.err;
    ASSERT_EQ(unfolded.code, 0) << unfolded.err;
    const nlohmann::json a = nlohmann::json::parse(folded.out), b = nlohmann::json::parse(unfolded.out);
    EXPECT_EQ(a["running_devices"].get<int>(), folded_threads) << split;  // one per pipeline stage
    EXPECT_EQ(b["running_devices"].get<int>(), devices) << split;
    EXPECT_EQ(a["summary"], b["summary"]) << split;
    EXPECT_EQ(a["replica_devices"], b["replica_devices"]) << split;
  }
}

// Serve's KV cache follows the K/V heads (GQA): tiny-llama (4 query heads
// over 2 K/V heads) against the same model with a K/V head per query head
// (--kv-heads 4), fp32, 1 GiB per device, 90% of it for weights, the probe
// step's activations and the cache, blocks of 16 tokens. By hand: a token
// caches K and V of 4 layers for the K/V heads a device's query heads read,
// each head 32 floats; the weights are tiny-llama's 869,504 parameters plus
// 2 · 128 · 32 per extra K/V head in each of k_proj and v_proj per layer,
// over tp when tp splits them (embed_tokens, lm_head, q/o, gate/up/down
// split; norms whole), whole when replicated. The activations are the probe
// step's, as the report measures them.
TEST(CliServe, KvCacheCapacityFollowsTheKvHeads) {
  const double budget = 0.9 * 1024 * 1024 * 1024;
  const int layers = 4, embd = 128, head = 32, ffn = 352, vocab = 512, block = 16, elem = 4;
  struct Case {
    int tp, kv_heads;
    int cached_heads;  // per device: the K/V heads its query heads read
    int held_heads;    // per device: the K/V heads its k_proj / v_proj rows compute
  };
  // tp 4 over 2 K/V heads replicates the projection (both heads on every
  // rank) but each rank's one query head reads one K/V head.
  const Case cases[] = {{1, 2, 2, 2}, {1, 4, 4, 4}, {2, 2, 1, 1}, {2, 4, 2, 2}, {4, 2, 1, 2}, {4, 4, 1, 1}};
  std::map<std::pair<int, int>, int64_t> blocks;
  for (const Case& c : cases) {
    const std::string flags = "serve --model tiny-llama --precision fp32 --memory 1GiB --kv-fraction 0.9 --kv-block 16 "
                              "--max-batch-tokens 256 --requests 4 --prompt-len 8 --output-len 4 --json --tp " +
                              std::to_string(c.tp) + " --kv-heads " + std::to_string(c.kv_heads);
    const CliResult r = run_cli(flags);
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const int64_t split = 2 * vocab * embd + layers * (2 * embd * embd + 3 * ffn * embd);  // over tp
    const int64_t whole = layers * 2 * embd + embd;                                          // norms
    const int64_t kv = layers * 2 * c.held_heads * head * embd;
    const double weights = double(split / c.tp + whole + kv) * elem;
    const double per_token = 2.0 * layers * c.cached_heads * head * elem;
    ASSERT_EQ(j["replica_devices"].size(), size_t(c.tp));
    const nlohmann::json& d = j["replica_devices"][0];
    EXPECT_EQ(d["kv_bytes_per_token"].get<double>(), per_token) << flags;
    EXPECT_EQ(d["weight_bytes"].get<double>(), weights) << flags;
    const double room = budget - weights - d["activation_bytes"].get<double>();
    const int64_t want = int64_t(std::floor(room / (per_token * block)));
    EXPECT_EQ(j["scheduler"]["kv_blocks"].get<int64_t>(), want) << flags;
    EXPECT_EQ(j["summary"]["kv_capacity_tokens_per_replica"].get<int64_t>(), want * block) << flags;
    blocks[{c.tp, c.kv_heads}] = j["scheduler"]["kv_blocks"].get<int64_t>();
    std::printf("tp %d, %d K/V heads: %.0f KV bytes per token per device, %lld blocks of %d\n", c.tp, c.kv_heads,
                per_token, static_cast<long long>(want), block);
  }
  // heads / kv heads = 2 times the tokens per byte; the GQA model's weights
  // and activations are also smaller, so at least twice the blocks. (At tp 4
  // each rank caches one K/V head either way: the same bytes per token.)
  for (int tp : {1, 2}) {
    const int64_t gqa = blocks.at({tp, 2}), mha = blocks.at({tp, 4});
    EXPECT_GE(gqa, 2 * mha) << "tp " << tp;
  }
}

// Blocks of one token for a model of 32 bytes of KV per token (one layer,
// K and V of width 8 in bf16) would be
// 2.4 billion blocks on the profile's 80 GiB: the pool holds 2^31 - 1 (its
// ids are 32-bit), and the run serves. It failed an internal check ("KV
// block count out of range", exit 134) until session 34's serve fuzzer.
// An FP8 checkpoint (--precision fp8) frees 1 B of every linear's weight:
// Llama 3 70B at tp 4 on H100s, 80 x (q, k, v, o, gate, up, down) / 4 bytes
// a rank (counted here), which the KV cache takes (its rows stay BF16).
TEST(CliServe, Fp8WeightsLeaveTheirBytesToTheKvCache) {
  std::map<std::string, nlohmann::json> runs;
  for (const std::string precision : {"bf16", "fp8"}) {
    const CliResult r = run_cli("serve --model llama3-70b --profile h100-nvlink --tp 4 --phantom --requests 2 "
                                "--prompt-len 100 --output-len 4 --json --precision " + precision);
    ASSERT_EQ(r.code, 0) << r.err;
    runs[precision] = nlohmann::json::parse(r.out);
  }
  const double C = 8192, KV = 8 * 128, F = 28672;
  const double linears = 80 * (C * C + 2 * KV * C + C * C + 2 * F * C + F * C) / 4;
  for (size_t d = 0; d < 4; ++d) {
    const nlohmann::json &a = runs["bf16"]["replica_devices"][d], &b = runs["fp8"]["replica_devices"][d];
    EXPECT_EQ(a["weight_bytes"].get<double>() - b["weight_bytes"].get<double>(), linears) << d;
    EXPECT_EQ(a["kv_bytes_per_token"], b["kv_bytes_per_token"]) << d;
  }
  const auto tokens = [&](const char* p) { return runs[p]["summary"]["kv_capacity_tokens_per_replica"].get<int64_t>(); };
  std::printf("llama3-70b, tp 4, H100: KV cache of %lld tokens in bf16, %lld in fp8\n",
              static_cast<long long>(tokens("bf16")), static_cast<long long>(tokens("fp8")));
  EXPECT_EQ(tokens("bf16"), 499648);
  EXPECT_EQ(tokens("fp8"), 708544);
  // And an FP8 cache (--kv-cache-dtype fp8): 1 B a cached element, half the
  // bytes a token (80 layers x 2 x 2 K/V heads of 128 a rank), twice the tokens.
  const CliResult r = run_cli("serve --model llama3-70b --profile h100-nvlink --tp 4 --phantom --requests 2 "
                              "--prompt-len 100 --output-len 4 --json --precision fp8 --kv-cache-dtype fp8");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["replica_devices"][0]["kv_bytes_per_token"].get<double>(), 80.0 * 2 * 2 * 128 * 1);
  std::printf("and %lld with an FP8 KV cache\n",
              static_cast<long long>(j["summary"]["kv_capacity_tokens_per_replica"].get<int64_t>()));
  EXPECT_EQ(j["summary"]["kv_capacity_tokens_per_replica"].get<int64_t>(), 1417088);
}

TEST(CliServe, BlocksOfOneTokenForATinyModelFitTheIds) {
  for (const char* mode : {"", "--phantom "}) {
    const CliResult r = run_cli(std::string("serve --family gpt --layers 1 --heads 1 --embd 8 --seq 64 --vocab 64 --precision bf16 "
                                            "--requests 4 --prompt-len 6 --output-len 3 --kv-block 1 --json ") + mode);
    ASSERT_EQ(r.code, 0) << mode << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["scheduler"]["kv_blocks"].get<int64_t>(), 2147483647) << mode;
    EXPECT_EQ(j["summary"]["requests"].get<int>(), 4) << mode;
  }
}

TEST(CliServe, BadInputIsOneLineAndExitTwo) {
  const std::string workload = ::testing::TempDir() + "serve_bad_workload.csv";
  std::ofstream(workload) << "arrival_s,prompt_len,output_len\n0,5,x\n";
  const std::string ids = ::testing::TempDir() + "serve_bad_ids.csv", few = ::testing::TempDir() + "serve_few_ids.csv";
  std::ofstream(ids) << "arrival_s,prompt_len,output_len,prompt_tokens\n0,2,2,1 512\n";  // tiny's vocabulary: 512
  std::ofstream(few) << "arrival_s,prompt_len,output_len,prompt_tokens\n0,3,2,1 2\n";
  const std::string prefix = ::testing::TempDir() + "serve_bad_prefix.csv";
  std::ofstream(prefix) << "arrival_s,prompt_len,output_len,prefix_id,prefix_len\n0,5,2,0,9\n";
  const std::pair<std::string, std::string> cases[] = {
      {"--requests 0", "--requests"},
      {"--kv-cache-dtype fp4", "--kv-cache-dtype: unknown \"fp4\" (auto, fp8)"},
      {"--arrival poisson:0", "--arrival"},
      {"--arrival steady", "--arrival"},
      {"--prompt-len 0", "--prompt-len"},
      {"--output-len uniform:9:2", "--output-len"},
      {"--prompt-len lognormal:10:nan", "--prompt-len"},
      {"--batching dynamic", "--batching"},
      {"--kv-fraction 0", "--kv-fraction"},
      {"--kv-fraction 1.5", "--kv-fraction"},
      {"--kv-block 0", "--kv-block"},
      {"--max-seqs 0", "--max-seqs"},
      {"--max-batch-tokens 0", "--max-batch-tokens"},
      {"--chunked-prefill -1", "--chunked-prefill"},
      {"--replicas 0", "--replicas"},
      {"--replicas 99", "the profile has"},
      {"--tp 3", "--tp"},
      {"--workload /nonexistent/w.csv", "--workload /nonexistent/w.csv: no such file"},
      {"--workload " + workload, "line 2"},
      {"--workload " + ::testing::TempDir(), ": is a directory, not a CSV file"},
      {"--workload " + workload + " --prompt-len 5", "gives the requests: it takes no --prompt-len"},
      {"--workload " + workload + " --requests 7", "gives the requests: it takes no --requests"},
      {"--workload " + workload + " --arrival burst", "gives the requests: it takes no --arrival"},
      {"--workload " + workload + " --output-len 3", "gives the requests: it takes no --output-len"},
      {"--workload " + workload + "/w.csv", "/w.csv: cannot open (Not a directory)"},
      {"--prompt-len 60 --output-len 10", "context of 64"},
      {"--batching static --chunked-prefill 8", "continuous"},
      {"--max-batch-tokens 8 --prompt-len 20", "--chunked-prefill"},
      {"--memory 64KiB", "memory"},
      {"--report /nonexistent/dir/r.json", "--report"},
      {"--phantom --init " + workload, "takes no --init"},
      {"--init /nonexistent/w.safetensors", "--init"},
      {"--init " + workload, "--init"},
      {"--init " + counting_checkpoint(), "--init"},  // nano's tensors, not tiny's
      {"--layers 96 --embd 16384", "--phantom"},  // 1.1 TiB of fp32 weights
      {"--workload " + ids, "outside the vocabulary"},
      {"--workload " + few, "prompt_len says 3"},
      {"--batching foo --prompt-len 128 --output-len 128", "--batching"},  // a bad flag before what the lengths mean
      {"--batch 3", "--batch"},  // training's flags, which serve would ignore
      {"--aux-coef 0.1", "--aux-coef"},
      {"--dropout 0.1", "--dropout"},
      {"--phantom --temperature 0.8", "--phantom computes no tokens: it takes no --temperature"},
      {"--top-p 0.9", "--top-p 0.9 filters sampling: it needs --temperature above 0"},
      {"--top-k 4", "--top-k 4 filters sampling"},
      {"--temperature 1 --top-p 0", "--top-p must be in (0, 1]"},
      {"--prefix-caching --batching static", "--prefix-caching needs --batching continuous"},
      {"--workload " + workload + " --shared-prefix 4", "gives the requests: it takes no --shared-prefix"},
      {"--workload " + prefix, "prefix_len 9 exceeds prompt_len 5"},
      {"--speculative draft=tiny", "--speculative draft=tiny: expected draft=PRESET,k=N[,accept=P]"},
      {"--speculative draft=tiny,k=0", "k in [1, 64]"},
      {"--speculative draft=tiny,k=2,accept=0.5", "accept= is for --phantom"},
      {"--phantom --speculative draft=tiny,k=2", "--speculative needs accept=P"},
      {"--phantom --speculative draft=tiny,k=2,accept=2", "accept in [0, 1]"},
      {"--draft-init " + workload, "--draft-init is the draft model's: it needs --speculative"},
      {"--speculative draft=tiny,k=2 --draft-init " + workload, "--draft-init"},
      {"--speculative draft=nano,k=2", "--speculative: the draft model's vocabulary (256)"},
      {"--speculative draft=tiny,k=2 --pp 2", "no --pp or --ep"},
      {"--speculative draft=tiny,k=2 --prefix-caching", "--prefix-caching"},
      {"--speculative draft=tiny,k=2 --batching static", "--speculative needs --batching continuous"},
  };
  for (const auto& [flags, needle] : cases) {
    // Four requests of lengths that fit, unless the case sets them or gives a --workload.
    std::string base = "serve --model tiny ";
    const bool drawn = flags.find("--workload") == std::string::npos;
    if (drawn && flags.find("--requests") == std::string::npos) base += "--requests 4 ";
    if (drawn && flags.find("--prompt-len") == std::string::npos) base += "--prompt-len 8 ";
    if (drawn && flags.find("--output-len") == std::string::npos) base += "--output-len 4 ";
    expect_usage_error(base + flags, needle);
  }
  // --help lists no flag serve would ignore.
  const CliResult help = run_cli("serve --help");
  for (const char* flag : {"--aux-coef", "--batch ", "--dropout", "--steps", "--lr "})
    EXPECT_EQ(help.out.find(flag), std::string::npos) << flag;
  EXPECT_NE(help.out.find("--top-p"), std::string::npos);
  // The default lengths (128 + 128) do not fit tiny's context of 64: the line says which defaults to change.
  expect_usage_error("serve --model tiny", "(--seq); --prompt-len and --output-len are 128 unless given");
  expect_usage_error("serve --model tiny --prompt-len 100", "exceed the model's context of 64 (--seq)");
}

}  // namespace
}  // namespace shardlab::testing
