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
  // Generation and serving in FP8 need FP8 tensor cores too.
  expect_usage_error("generate --model tiny --prompt-tokens 1,2 --max-new-tokens 2 --precision fp8", "no FP8 peak");
  expect_usage_error("serve --model tiny --precision fp8 --requests 2 --prompt-len 8 --output-len 4", "no FP8 peak");
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

// --attention-kernel: which of the profile's published fused kernels runs.
// A name the profile lacks (or a profile with none) is one line and exit
// code 2; the text and the JSON name the kernel where the profile names it,
// and FlashAttention-2's slower rates make the same step longer.
TEST(CliHardwareFlags, AttentionKernelFlag) {
  const std::string run = "train --model tiny-llama --steps 1 --phantom --profile h100-nvlink --precision bf16 --seq 4096";
  expect_usage_error(run + " --attention-kernel fa4", "has the fused attention kernels cudnn, fa2, fa3");
  expect_usage_error(run + " --attention-kernel ''", "--attention-kernel");
  expect_usage_error(run + " --attention-kernel", "--attention-kernel");  // no value
  expect_usage_error("train --model tiny-llama --steps 1 --phantom --profile a100-nvlink --attention-kernel fa2",
                     "no named fused attention kernel");
  expect_usage_error("verify --model tiny --steps 1 --tp 2 --profile h100-nvlink --attention-kernel cuDNN",
                     "has the fused attention kernels");
  // A run that charges no fused kernel's rates has no use for the flag.
  expect_usage_error(run + " --attention unfused --attention-kernel fa2", "charges no fused attention kernel");
  expect_usage_error("train --model tiny --steps 1 --phantom --profile h100-nvlink --precision bf16 --attention-kernel "
                     "fa2",
                     "charges no fused attention kernel");  // GPT's auto: unfused
  expect_usage_error("train --model tiny-llama --steps 1 --phantom --profile h100-nvlink --attention-kernel fa2",
                     "an fp32 run charges its attention at the GEMM model");
  EXPECT_EQ(run_cli("train --model tiny --steps 1 --phantom --profile h100-nvlink --precision bf16 --cp 2 "
                    "--attention-kernel fa2")
                .code,
            0);  // the ring's blocks are fused kernels
  double step_ms[2] = {0, 0};
  const char* kernels[] = {"cudnn", "fa2"};
  for (int i = 0; i < 2; ++i) {
    const std::string args = run + (i ? " --attention-kernel fa2" : "");  // cudnn: the default
    const auto text = run_cli(args);
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_NE(text.out.find(std::string("(bf16, fused attention: ") + kernels[i] + ")"), std::string::npos) << text.out;
    const auto json = run_cli(args + " --json");
    ASSERT_EQ(json.code, 0) << json.err;
    const nlohmann::json j = nlohmann::json::parse(json.out);
    EXPECT_EQ(j["config"]["attention_kernel"], kernels[i]);
    step_ms[i] = j["summary"]["virtual_step_s"].get<double>();
  }
  EXPECT_GT(step_ms[1], step_ms[0]);
  // `shardlab profiles` lists each profile's choices under its description.
  const auto profiles = run_cli("profiles");
  ASSERT_EQ(profiles.code, 0) << profiles.err;
  const size_t h100 = profiles.out.find("  h100-nvlink: ");
  ASSERT_NE(h100, std::string::npos) << profiles.out;
  EXPECT_EQ(profiles.out.find("    fused attention kernels (--attention-kernel): cudnn (default), fa2, fa3\n", h100),
            profiles.out.find('\n', h100) + 1)
      << profiles.out;
  EXPECT_EQ(profiles.out.find("fused attention kernels", profiles.out.find("  a100-nvlink: ")),
            profiles.out.find("fused attention kernels", h100));  // none before h100-nvlink's
  // Unfused: no kernel to name.
  const auto unfused = run_cli(run + " --attention unfused --json");
  ASSERT_EQ(unfused.code, 0) << unfused.err;
  EXPECT_FALSE(nlohmann::json::parse(unfused.out)["config"].contains("attention_kernel"));
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
