// `shardlab train --phantom`: GPT-3 shapes on thousands of virtual GPUs from
// the command line, what it reports, and the inputs it refuses.
#include <nlohmann/json.hpp>

#include "tests/examples/shardlab/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

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
  const auto& s = j["summary"];
  // Full recomputation: the GPUs run more FLOPs than the model needs.
  EXPECT_GT(s["hfu"].get<double>(), s["mfu"].get<double>());
  EXPECT_GT(s["virtual_step_s"].get<double>(), 0);
  // Every device of a stage reports its representative's figures.
  EXPECT_EQ(j["devices"][1]["peak_bytes"], j["devices"][0]["peak_bytes"]);
  EXPECT_GT(j["devices"][0]["peak_bytes_by_kind"]["master"].get<uint64_t>(), 0u);
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
