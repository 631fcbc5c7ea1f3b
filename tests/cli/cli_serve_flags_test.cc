// shardlab serve's newer flags from the command line: --disaggregate (the
// tokens across the hand-off, the K and V's time on the links by hand),
// --router, --moe-router, and every flag's bad values (one line, exit 2).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/serve_cli_util.h"
#include "tests/support/cli_util.h"

namespace shardlab::testing {
namespace {

// One prefill and one decode replica of tp 2 on an a100-nvlink node: ranks
// 0, 1 prefill, 2, 3 decode; rank i hands its share to rank 2 + i over
// NVLink (2 us, 300 GB/s, packets of 256 bytes with 32 more on the wire by
// a copy engine). A request of prompt P moves P · kv_bytes_per_token bytes a
// rank, B, so its transfer takes 2 us + (B + ceil(B / 256) · 32) / 300e9 s.
// Its tokens are generate's for its prompt alone.
TEST(CliServeFlags, DisaggregatedTokensAreGeneratesAndTheTransferIsTheLinks) {
  const std::string init = "--model nano --init " + counting_checkpoint();
  const std::string report = ::testing::TempDir() + "serve_disaggregated_report.json";
  const CliResult r = run_cli("serve " + init + " --tp 2 --disaggregate prefill=1,decode=1 --requests 6 "
                              "--arrival poisson:2000 --prompt-len uniform:4:16 --output-len uniform:1:12 "
                              "--kv-block 4 --max-batch-tokens 32 --report " + report);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("1 prefill and 1 decode replica(s)"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(report));
  const double per_token = j["replica_devices"][0]["kv_bytes_per_token"].get<double>();
  EXPECT_EQ(per_token, j["replica_devices"][1]["kv_bytes_per_token"].get<double>());
  uint64_t bytes = 0;
  int moved = 0;
  for (const auto& q : j["requests"]) {
    const CliResult g = run_cli("generate --json " + init + " --prompt-tokens " + joined(q["prompt_tokens"]) +
                                " --max-new-tokens " + std::to_string(q["output_len"].get<int>()));
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(q["tokens"], nlohmann::json::parse(g.out)["tokens"]) << "request " << q["id"];
    if (q["output_len"].get<int>() == 1) {
      EXPECT_FALSE(q.contains("handoff"));
      continue;
    }
    const nlohmann::json& h = q["handoff"];
    const auto b = uint64_t(std::llround(per_token * q["prompt_len"].get<double>()));
    const double want = 2e-6 + double(b + (b + 255) / 256 * 32) / 300e9;
    std::printf("request %d: %llu bytes a rank, %.6f us on NVLink (by hand %.6f us)\n", q["id"].get<int>(),
                (unsigned long long)b, h["transfer_s"].get<double>() * 1e6, want * 1e6);
    EXPECT_NEAR(h["transfer_s"].get<double>(), want, 1e-12);  // the clock's picoseconds
    EXPECT_EQ(h["kv_bytes"].get<uint64_t>(), 2 * b);
    EXPECT_EQ(q["replica"].get<int>(), 1);
    EXPECT_NEAR(q["first_token_s"].get<double>(), h["arrive_s"].get<double>(), 0);
    bytes += 2 * b;
    ++moved;
  }
  EXPECT_GT(moved, 0);
  EXPECT_EQ(j["disaggregate"]["kv_bytes"].get<uint64_t>(), bytes);
  EXPECT_EQ(j["disaggregate"]["transfers"].get<int>(), moved);
}

TEST(CliServeFlags, RoutersRunAndTheMoeRouterIsMoeRouter) {
  for (const char* router : {"round-robin", "least-loaded", "prefix --prefix-caching --shared-prefix 8"}) {
    const CliResult r = run_cli(std::string("serve --model tiny --layers 2 --phantom --replicas 2 --requests 8 "
                                            "--prompt-len 8 --output-len 4 --json --router ") + router);
    ASSERT_EQ(r.code, 0) << router << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["summary"]["requests"].get<int>(), 8) << router;
  }
  // MoE scores are --moe-router wherever --router is serve's; train keeps --router as an alias.
  const CliResult moe = run_cli("serve --model tiny --layers 2 --phantom --experts 4 --moe-router sigmoid "
                                "--requests 2 --prompt-len 8 --output-len 4 --json");
  ASSERT_EQ(moe.code, 0) << moe.err;
  EXPECT_EQ(nlohmann::json::parse(moe.out)["model"]["router"], "sigmoid");
  expect_usage_error("serve --model tiny --experts 4 --router sigmoid --replicas 2 --prompt-len 8 --output-len 4",
                     "--router sigmoid: expected round-robin, least-loaded or prefix");
  const CliResult train = run_cli("train --model nano --experts 4 --router sigmoid --steps 1 --json");
  EXPECT_EQ(train.code, 0) << train.err;
}

TEST(CliServeFlags, BadValuesAreOneLineAndExitTwo) {
  const std::string csv = ::testing::TempDir() + "serve_flags_w.csv";
  std::ofstream(csv) << "arrival_s,prompt_len,output_len\n0,5,2\n";
  const std::pair<std::string, std::string> cases[] = {
      {"--shared-prefix -1", "--shared-prefix"},
      {"--shared-prefix nan", "--shared-prefix"},
      {"--shared-prefix 1e30", "--shared-prefix"},
      {"--shared-prefix 60", "exceed the model's context of 64"},  // 60 shared + 8 of its own
      {"--temperature -1", "--temperature"},
      {"--temperature nan", "--temperature"},
      {"--temperature 1e9", "--temperature"},
      {"--top-k -1", "--top-k"},
      {"--top-p 1.5", "--top-p"},
      {"--top-p nan", "--top-p"},
      {"--requests -3", "--requests"},
      {"--requests 1e9", "--requests"},
      {"--max-seqs nan", "--max-seqs"},
      {"--kv-block -4", "--kv-block"},
      {"--max-batch-tokens 1e30", "--max-batch-tokens"},
      {"--seed -1", "--seed"},
      {"--speculative k=2", "expected draft=PRESET,k=N"},
      {"--speculative draft=,k=2", "expected draft=PRESET,k=N"},
      {"--speculative draft=tiny,k=", "k in [1, 64]"},
      {"--speculative draft=tiny,k=nan", "k in [1, 64]"},
      {"--speculative draft=tiny,k=-2", "k in [1, 64]"},
      {"--speculative draft=tiny,k=1e9", "k in [1, 64]"},
      {"--speculative draft=tiny,k=0x10", "k in [1, 64]"},
      {"--speculative draft=tiny,k=2,k=3", "each once"},
      {"--speculative draft=tiny,k=2,temp=1", "draft=PRESET,k=N"},
      {"--speculative draft=bogus,k=2", "bogus"},
      {"--phantom --speculative draft=tiny,k=2,accept=nan", "accept in [0, 1]"},
      {"--phantom --speculative draft=tiny,k=2,accept=-0.1", "accept in [0, 1]"},
      {"--speculative draft=tiny,k=2 --draft-init /nonexistent/d.safetensors", "--draft-init"},
      {"--speculative draft=tiny,k=2 --disaggregate prefill=1,decode=1", "--speculative"},
      {"--disaggregate prefill=1", "--disaggregate prefill=1: expected prefill=N,decode=M"},
      {"--disaggregate prefill=0,decode=1", "expected prefill=N,decode=M"},
      {"--disaggregate prefill=1,decode=0", "expected prefill=N,decode=M"},
      {"--disaggregate prefill=-1,decode=1", "expected prefill=N,decode=M"},
      {"--disaggregate prefill=1e9,decode=1", "expected prefill=N,decode=M"},
      {"--disaggregate prefill=1,decode=1,decode=2", "expected prefill=N,decode=M"},
      {"--disaggregate prefill=a,decode=1", "expected prefill=N,decode=M"},
      {"--disaggregate 'prefill=1;decode=1'", "expected prefill=N,decode=M"},
      {"--disaggregate ''", "--disaggregate"},
      {"--disaggregate prefill=1,decode=1 --replicas 2", "it takes no --replicas"},
      {"--disaggregate prefill=1,decode=1 --replicas 1", "it takes no --replicas"},
      {"--disaggregate prefill=20,decode=20", "the profile has 32"},
      {"--disaggregate prefill=1,decode=1 --batching static", "--disaggregate needs --batching continuous"},
      {"--router random --replicas 2", "--router random: expected round-robin, least-loaded or prefix"},
      {"--router least-loaded", "it needs --replicas 2 or more, or --disaggregate"},
      {"--router prefix --replicas 2", "--router prefix routes by the prefix cache: it needs --prefix-caching"},
      {"--workload " + csv + " --shared-prefix 2", "it takes no --shared-prefix"},
  };
  for (const auto& [flags, needle] : cases) {
    std::string base = "serve --model tiny ";
    if (flags.find("--workload") == std::string::npos) {
      if (flags.find("--requests") == std::string::npos) base += "--requests 4 ";
      base += "--prompt-len 8 --output-len 4 ";
    }
    expect_usage_error(base + flags, needle);
  }
}

}  // namespace
}  // namespace shardlab::testing
