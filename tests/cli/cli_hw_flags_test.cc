// --precision and --attention at the command line: bad values and flags that
// mean nothing in their context get one line on stderr and exit code 2; the
// report (text and --json) says which attention kernel the run charged.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

TEST(CliHardwareFlags, BadValuesAreOneLineAndExitCode2) {
  expect_usage_error("train --model tiny --steps 1 --precision FP8", "--precision");  // names are lower case
  expect_usage_error("train --model tiny --steps 1 --precision fp16", "--precision");
  expect_usage_error("train --model tiny --steps 1 --precision ''", "--precision");
  expect_usage_error("train --model tiny --steps 1 --attention Fused", "--attention");
  expect_usage_error("train --model tiny --steps 1 --attention flash2", "--attention");
  expect_usage_error("train --model tiny --steps 1 --attention", "--attention");  // no value
}

TEST(CliHardwareFlags, MeaninglessContextsAreRefused) {
  // No FP8 tensor cores on an A100 (its profile has no FP8 peak).
  expect_usage_error("train --model tiny --steps 1 --profile a100-nvlink --precision fp8", "no FP8 peak");
  expect_usage_error("verify --model tiny --steps 1 --tp 2 --profile a100-nvlink --precision fp8", "no FP8 peak");
  // FP8 is Transformer Engine's training recipe: generation and serving refuse it.
  expect_usage_error("generate --model tiny --prompt-tokens 1,2 --max-new-tokens 2 --precision fp8 "
                     "--profile h100-nvlink",
                     "FP8 inference is not modeled");
  expect_usage_error("serve --model tiny --profile h100-nvlink --precision fp8 --requests 2 --prompt-len 8 "
                     "--output-len 4",
                     "FP8 inference is not modeled");
  // The fused kernel (FlashAttention-2/3) takes head dimensions up to 256: 1280 / 4 = 320.
  expect_usage_error("train --model tiny --steps 1 --phantom --embd 1280 --heads 4 --attention fused",
                     "head dimensions up to 256, this model's is 320");
  // The llama family's default is the fused kernel: the same refusal names it.
  expect_usage_error("train --model tiny-llama --steps 1 --phantom --embd 1280 --heads 4 --kv-heads 4",
                     "the llama family's default");
  // --attention is a training flag: generation has no such option.
  expect_usage_error("generate --model tiny --prompt-tokens 1,2 --max-new-tokens 2 --attention fused",
                     "--attention");
}

// The report echoes the kernel: auto resolves to unfused for the GPT family
// and fused for llama; an explicit choice is kept.
TEST(CliHardwareFlags, TheReportNamesTheAttentionKernel) {
  struct Case {
    std::string args, kernel;
  };
  for (const Case& c : {Case{"--model tiny", "unfused"}, Case{"--model tiny --attention fused", "fused"},
                        Case{"--model tiny-llama", "fused"}, Case{"--model tiny-llama --attention unfused", "unfused"}}) {
    const auto text = run_cli("train " + c.args + " --steps 1 --phantom");
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_NE(text.out.find("(fp32, " + c.kernel + " attention)"), std::string::npos) << c.args << "\n" << text.out;
    const auto json = run_cli("train " + c.args + " --steps 1 --phantom --json");
    ASSERT_EQ(json.code, 0) << json.err;
    const nlohmann::json j = nlohmann::json::parse(json.out);
    EXPECT_EQ(j["config"]["attention"], c.kernel) << c.args;
  }
}

// --fusions: a list applied to the default; a bad item is one line and exit
// code 2; the text names a non-default choice, the JSON always has it.
TEST(CliHardwareFlags, FusionsFlag) {
  expect_usage_error("train --model tiny --steps 1 --fusions bias_dropout_add", "unknown kernel fusion");
  expect_usage_error("train --model tiny --steps 1 --fusions norm,", "unknown kernel fusion ''");
  expect_usage_error("train --model tiny --steps 1 --fusions ''", "--fusions");
  expect_usage_error("train --model tiny --steps 1 --fusions", "--fusions");  // no value
  const auto base = run_cli("train --model tiny --steps 1 --phantom --dropout 0.1");
  ASSERT_EQ(base.code, 0) << base.err;
  EXPECT_NE(base.out.find("(fp32, unfused attention)"), std::string::npos) << base.out;
  const auto text = run_cli("train --model tiny --steps 1 --phantom --dropout 0.1 --fusions bias-dropout-add,no-norm");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("(fp32, unfused attention, fused: swiglu,softmax,bias-dropout-add,cross-entropy)"),
            std::string::npos)
      << text.out;
  const auto json = run_cli("train --model tiny --steps 1 --phantom --fusions none --json");
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["config"]["parallel"]["fusions"], "none");
}

}  // namespace
}  // namespace shardlab
