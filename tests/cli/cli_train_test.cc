// The command-line contract of `shardlab train`.
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <span>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gpt.h"
#include "model/io/data.h"
#include "model/io/safetensors.h"
#include "tests/support/cli_util.h"
#include "tests/support/compare.h"
#include "tests/support/sanitizer.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;
using testing::slurp;

std::string tmp(const std::string& name) { return ::testing::TempDir() + "train_" + name; }

nlohmann::json train_report(const std::string& args, const std::string& name) {
  const std::string report = tmp(name + ".json");
  auto r = run_cli("train " + args + " --report " + report);
  EXPECT_EQ(r.code, 0) << r.err;
  return nlohmann::json::parse(slurp(report));
}

TEST(CliTrain, TinyModelLearnsTheMarkovSource) {
  // Under ThreadSanitizer (10-15x slower) 40 steps, which fall by about 1.5 (120 steps: about 3).
  const int n = testing::kThreadSanitizer ? 40 : 120;
  const double drop = testing::kThreadSanitizer ? 1.0 : 2.5;
  auto j = train_report("--model tiny --data synthetic:markov --steps " + std::to_string(n), "learn");
  const auto& steps = j["steps"];
  ASSERT_EQ(steps.size(), size_t(n));
  const double first = steps.front()["loss"], last = steps.back()["loss"];
  const double best = j["summary"]["best_loss"];
  std::printf("tiny markov: loss %.4f -> %.4f in %d steps (best achievable %.4f)\n", first, last, n, best);
  EXPECT_NEAR(first, std::log(512.0), 0.2);  // uniform prediction at init
  EXPECT_LT(last, first - drop);
  EXPECT_GT(last, best);
  // The report has the summary and device fields README's `--report FILE.json` lists.
  for (const char* k : {"virtual_step_s", "host_tokens_per_s", "bubble_fraction", "mfu"})
    EXPECT_TRUE(j["summary"].contains(k)) << k;
  const auto& dev = j["devices"][0];
  for (const char* k : {"rank", "coords", "peak_bytes", "compute_s", "comm_s", "idle_s"})
    EXPECT_TRUE(dev.contains(k)) << k;
  EXPECT_GT(dev["peak_bytes_by_kind"]["activation"].get<uint64_t>(), 0u);
  // Params + grads + AdamW state of 867,072 fp32 parameters: 16 bytes each.
  EXPECT_EQ(dev["peak_bytes_by_kind"]["param"].get<uint64_t>(), 867072u * 4);
  EXPECT_EQ(dev["peak_bytes_by_kind"]["optimizer"].get<uint64_t>(), 867072u * 8);
  // Every step of a single device takes the same virtual time.
  const double t1 = steps[1]["virtual_time_s"], t0 = steps[0]["virtual_time_s"], t2 = steps[2]["virtual_time_s"];
  EXPECT_DOUBLE_EQ(t2 - t1, t1 - t0);
}

TEST(CliTrain, IdenticalRunsGiveBitIdenticalLossesAndCheckpoints) {
  const std::string a = tmp("a.safetensors"), b = tmp("b.safetensors");
  auto ja = train_report("--model nano --experts 4 --top-k 2 --steps 8 --save " + a, "a");
  auto jb = train_report("--model nano --experts 4 --top-k 2 --steps 8 --save " + b, "b");
  ASSERT_EQ(ja["steps"].size(), 8u);
  ASSERT_EQ(jb["steps"].size(), 8u);
  for (size_t i = 0; i < ja["steps"].size(); ++i) {
    EXPECT_EQ(ja["steps"][i]["loss"].get<double>(), jb["steps"][i]["loss"].get<double>()) << i;
    EXPECT_EQ(ja["steps"][i]["virtual_time_s"].get<double>(), jb["steps"][i]["virtual_time_s"].get<double>());
  }
  const std::string bytes_a = slurp(a), bytes_b = slurp(b);
  EXPECT_GT(bytes_a.size(), 100000u);
  EXPECT_TRUE(bytes_a == bytes_b) << "checkpoints differ";
  EXPECT_GT(ja["steps"][0]["aux_loss"].get<double>(), 0);
}

// The loss of the parameters in `path` on step 0's global batch, evaluated
// outside the tool: GPT<float> with the file's tensors, the batch drawn by a
// BatchSampler built from the report's config (data, seed, sampling, sizes).
float loss_of_checkpoint(const std::string& path, const nlohmann::json& config) {
  model::GPTConfig c;
  const auto& m = config.at("model");
  c.n_layer = m.at("layers"), c.n_head = m.at("heads"), c.n_embd = m.at("embd");
  c.block_size = m.at("seq"), c.vocab_size = m.at("vocab"), c.n_expert = m.at("experts");
  c.batch_size = config.at("batch");
  const uint64_t seed = config.at("seed");
  model::GPT<float> gpt(c, seed + 1);  // every tensor is overwritten from the file
  const model::SafetensorsFile f = model::load_safetensors(path);
  for (const model::ParamSpec& s : gpt.table().specs()) {
    const std::span<const float> t = f.get(s.name, s.shape);
    std::copy(t.begin(), t.end(), gpt.params().begin() + s.offset);
  }
  auto data = std::make_shared<const model::TokenData>(
      model::open_token_data(config.at("data"), c.vocab_size, c.block_size, seed));
  const model::BatchSampler sampler(data, c.batch_size, c.block_size,
                                    model::parse_sampling(config.at("sampling").get<std::string>()), seed);
  const model::Batch b = sampler.next_batch(0);
  return gpt.forward(b.x.data(), b.y.data(), int(b.rows), int(b.seq));
}

// --arithmetic portable swaps Eigen's GEMM for the project's fixed-order one
// (model/arithmetic.h): the same math in another summation order, so the
// losses agree with the native run to fp32 noise (tol 1e-5 relative, printed),
// and the report says which arithmetic ran. Its bits being the same on every
// machine is what the pinned runs check (pinned_runs_test.cc).
TEST(CliTrain, PortableArithmeticMatchesNativeToFp32NoiseAndIsReported) {
  const std::string args = "--model tiny --steps 5 --tp 2 --dp 2";
  const auto native = train_report(args, "native");
  const auto portable = train_report(args + " --arithmetic portable", "portable");
  EXPECT_EQ(native["config"]["arithmetic"], "native");
  EXPECT_EQ(portable["config"]["arithmetic"], "portable");
  std::vector<double> a, b;
  for (const auto& s : native["steps"]) a.push_back(s["loss"].get<double>());
  for (const auto& s : portable["steps"]) b.push_back(s["loss"].get<double>());
  const auto close = testing::all_close_rel(b, a, 1e-5, 0);
  std::printf("portable vs native losses over 5 steps: %s\n", close.message());
  EXPECT_TRUE(close);
}

TEST(CliTrain, InitFromACheckpointContinuesTraining) {
  // AdamW's moments are not in the checkpoint, so 3 steps + 3 more from it
  // is not 6 steps in one go. What is exact: --init starts from exactly the
  // saved weights, so the first loss after --init is, bit for bit, the loss
  // of the saved parameters on step 0's batch evaluated independently.
  const std::string ckpt = tmp("mid.safetensors");
  auto j1 = train_report("--model nano --steps 3 --sampling sequential --save " + ckpt, "first");
  ASSERT_EQ(j1["steps"].size(), 3u);
  auto j2 = train_report("--model nano --steps 1 --sampling sequential --init " + ckpt, "second");
  auto j0 = train_report("--model nano --steps 1 --sampling sequential", "fresh");
  ASSERT_EQ(j2["steps"].size(), 1u);
  const float want = loss_of_checkpoint(ckpt, j2["config"]);
  const double fresh = j0["steps"][0]["loss"], resumed = j2["steps"][0]["loss"];
  std::printf("step-0 loss: fresh %.9g, from checkpoint %.9g, the checkpoint evaluated outside the tool %.9g "
              "(must be equal)\n",
              fresh, resumed, double(want));
  EXPECT_EQ(resumed, double(want));
  // The checkpoint holds trained weights: lower than a fresh init's loss.
  EXPECT_LT(resumed, fresh);
  // The metadata carries the config.
  const std::string bytes = slurp(ckpt);
  EXPECT_NE(bytes.find("shardlab_config"), std::string::npos);
}

TEST(CliTrain, TraceShowsEveryKernelOnTheComputeStream) {
  const std::string trace = tmp("trace.json");
  auto r = run_cli("train --model nano --steps 2 --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(slurp(trace));
  std::set<std::string> names;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") names.insert(e["name"].get<std::string>());
  for (const char* k : {"attn.c_attn.fwd", "attn.softmax.bwd", "mlp.gelu.fwd", "lm_head.bwd", "adamw", "grad_norm"})
    EXPECT_TRUE(names.count(k)) << k;
}

// A profile is one node type: --nodes scales it past its own node count.
TEST(CliTrain, NodesScaleTheProfile) {
  // 64 devices: more than the 4 x 8 of a100-nvlink.
  expect_usage_error("train --model tiny --dp 8 --tp 2 --pp 4 --batch 32 --micro-batches 4 --steps 1",
                     "64 devices requested but profile a100-nvlink has 32 (4 nodes x 8)");
  const auto r = testing::run_cli(
      "train --model tiny --dp 8 --tp 2 --pp 4 --batch 32 --micro-batches 4 --steps 1 --nodes 8 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["devices"], 64);
  EXPECT_EQ(j["devices"].size(), 64u);
  EXPECT_EQ(j["devices"][63]["node"], 7);
  for (const char* bad : {"0", "-1", "200000"})
    expect_usage_error(std::string("train --model tiny --steps 1 --nodes ") + bad, "--nodes");
  expect_usage_error("train --model tiny --steps 1 --nodes abc", "--nodes");
}

TEST(CliTrain, OutOfMemoryNamesTheDevice) {
  // Parameters, gradients and Adam state alone: refused before any thread
  // starts, with the sizes (tiny: 867072 parameters, 3.3 MiB in fp32).
  expect_usage_error("train --model tiny --steps 1 --memory 4MiB",
                     "device 0 (TP(1)-PP(1)-DP(1)-Rank(0)): out of memory before any activation: parameters "
                     "3.3 MiB, gradients 3.3 MiB and optimizer state 6.6 MiB need 13.2 MiB, more than its "
                     "capacity 4.0 MiB");
  // They fit, but not with the least the activations need (4 blocks x (attention 8x4x64x64 + qkv
  // 3x512x128) + logits and probabilities 2x512x512 floats = 7.0 MiB): refused before any thread starts.
  expect_usage_error("train --model tiny --steps 1 --memory 20MiB",
                     "device 0 (TP(1)-PP(1)-DP(1)-Rank(0)): out of memory: parameters, gradients and optimizer "
                     "state need 13.2 MiB and the activations of one micro-batch at least 7.0 MiB");
  // That floor fits, the activations do not: the arena's own out-of-memory.
  expect_usage_error("train --model tiny --steps 1 --memory 24MiB", "device 0: out of memory allocating");
}

// Configs far beyond the device or the host never reach the host allocator.
TEST(CliTrain, OversizedModelsAreRefusedBeforeAnyThreadStarts) {
  expect_usage_error("train --model tiny --steps 1 --embd 1048576 --heads 1",
                     "out of memory before any activation: parameters 192.0 TiB");
  expect_usage_error("train --model tiny --steps 1 --layers 60000", "more than its capacity 80.0 GiB");
  // Fits each modeled A100, not this host (8 replicas of 2.5 B parameters).
  expect_usage_error("train --model tiny --steps 1 --dp 8 --layers 200 --embd 1024 --heads 16",
                     "of host memory for the parameters, gradients and optimizer state of its 8 devices");
}

TEST(CliTrain, BadInputIsOneLineAndExitCode2) {
  expect_usage_error("train --model tiny --heads 3", "--heads");
  expect_usage_error("train --model tiny --steps 0", "--steps: 0 is out of range: must be between 1 and");
  expect_usage_error("train --model huge", "huge");
  expect_usage_error("train --data synthetic:nonsense", "nonsense");
  expect_usage_error("train --data /nonexistent/tokens.bin", "/nonexistent/tokens.bin");
  expect_usage_error("train --lr-schedule linear", "--lr-schedule");
  expect_usage_error("train --precision fp4", "--precision");
  // fp8 is a precision, but an A100 has no FP8 tensor cores.
  expect_usage_error("train --precision fp8", "no FP8 peak");
  expect_usage_error("train --attention flash", "--attention");
  expect_usage_error("train --model nano --experts 4 --top-k 5", "top");

  // Tokens >= vocab in a .bin file.
  const std::string bin = tmp("bad.bin");
  {
    std::ofstream out(bin, std::ios::binary);
    for (uint16_t t = 0; t < 200; ++t) {
      uint16_t v = t == 77 ? 9999 : t % 100;
      out.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
  expect_usage_error("train --model nano --seq 16 --data " + bin, "9999");

  // A checkpoint whose position table is shorter than --seq.
  const std::string ckpt = tmp("short.safetensors");
  ASSERT_EQ(run_cli("train --model nano --steps 1 --save " + ckpt).code, 0);
  expect_usage_error("train --model nano --seq 64 --steps 1 --init " + ckpt, "transformer.wpe.weight");
  expect_usage_error("train --model nano --init /nonexistent.safetensors", "/nonexistent.safetensors");
}

// Megatron's --use-distributed-optimizer alone is ZeRO-1's sharding with
// reduce-scattered gradients: the report says zero 1 and the flag, and the
// step takes what --zero 2's takes (the same collectives; memory aside).
TEST(CliTrain, DistributedOptimizerFlagAloneMeansZeroOne) {
  const auto d = train_report("--model tiny --steps 1 --dp 2 --bucket-mb 1 --use-distributed-optimizer", "distopt");
  EXPECT_EQ(d["config"]["parallel"]["zero"], 1) << d["config"]["parallel"];
  EXPECT_EQ(d["config"]["parallel"]["distributed_optimizer"], true) << d["config"]["parallel"];
  const auto z2 = train_report("--model tiny --steps 1 --dp 2 --bucket-mb 1 --zero 2", "zero2");
  const auto z1 = train_report("--model tiny --steps 1 --dp 2 --bucket-mb 1 --zero 1", "zero1");
  EXPECT_EQ(d["summary"]["virtual_step_s"], z2["summary"]["virtual_step_s"]);
  EXPECT_NE(d["summary"]["virtual_step_s"], z1["summary"]["virtual_step_s"]);
}

TEST(CliTrain, HelpListsTheSyntheticTasks) {
  auto r = run_cli("train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("synthetic:markov"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Exit status: 0 on success, 1 when the data-parallel copies"), std::string::npos) << r.out;
}

// Every real-math run checks what must end bit-identical (the data-parallel
// copies, a pipeline's tied embedding copy) and reports the tp-replicated
// tensors; a difference is a failed check: exit 1, named in the last line.
TEST(CliTrain, ReplicasAreCheckedAtTheEndOfEveryRun) {
  const std::string cfg = "train --model tiny --steps 2 --dp 2 --tp 2 --pp 2 --micro-batches 2";
  const auto ok = run_cli(cfg + " --json");
  ASSERT_EQ(ok.code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out)["replicas"];
  EXPECT_EQ(j["data_parallel_copies"], 2) << j;
  EXPECT_EQ(j["identical"], true) << j;
  EXPECT_TRUE(j["first_difference"].is_null()) << j;
  EXPECT_EQ(j["max_abs_diff"], 0.0) << j;
  ASSERT_TRUE(j["tp_replica_drift"].is_object()) << j;  // tp 2: its copies are compared too
  const auto text = run_cli(cfg);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("replicas: the 2 data-parallel copies of the parameters and the last stage's copy of the "
                          "tied embedding are bit-identical after the last step"),
            std::string::npos)
      << text.out;
  EXPECT_EQ(text.out.find("FAIL"), std::string::npos) << text.out;

  // dp rank 1's copy of ln_f.bias perturbed after the last step (--corrupt-shard, verify's testing aid).
  const std::string bad = "train --model tiny --steps 2 --dp 2 --corrupt-shard transformer.ln_f.bias:1";
  const auto failed = run_cli(bad + " --json");
  EXPECT_EQ(failed.code, 1) << failed.err;
  const auto k = nlohmann::json::parse(failed.out)["replicas"];
  EXPECT_EQ(k["identical"], false) << k;
  EXPECT_EQ(k["first_difference"], "transformer.ln_f.bias on dp rank 1") << k;
  EXPECT_GT(k["max_abs_diff"].get<double>(), 1e-3) << k;
  EXPECT_NE(failed.err.find("FAIL: data-parallel replicas differ: transformer.ln_f.bias on dp rank 1"),
            std::string::npos)
      << failed.err;
  const auto failed_text = run_cli(bad);
  EXPECT_EQ(failed_text.code, 1);
  const std::string last = failed_text.out.substr(failed_text.out.rfind('\n', failed_text.out.size() - 2) + 1);
  EXPECT_EQ(last.rfind("FAIL: data-parallel replicas differ: transformer.ln_f.bias on dp rank 1", 0), 0u)
      << failed_text.out;

  // One copy, nothing replicated: no line; a phantom run has no copies to compare.
  const auto one = run_cli("train --model tiny --steps 1");
  EXPECT_EQ(one.out.find("replicas:"), std::string::npos) << one.out;
  const auto phantom = run_cli("train --model tiny --steps 1 --dp 2 --phantom --json");
  ASSERT_EQ(phantom.code, 0) << phantom.err;
  EXPECT_FALSE(nlohmann::json::parse(phantom.out).contains("replicas"));
}

}  // namespace
}  // namespace shardlab

namespace shardlab {
namespace {

TEST(CliShapes, FfnWidthFlagAndBadValues) {
  // tiny with a 384-wide MLP: 4 blocks x (2 x 128 x 128 + 128) fewer parameters than 867072.
  const auto j = train_report("--model tiny --ffn-hidden-size 384 --steps 1", "ffn384");
  EXPECT_EQ(j["config"]["model"]["ffn"], 384);
  EXPECT_EQ(j["summary"]["n_params"], 867072 - 4 * (2 * 128 * 128 + 128));
  EXPECT_EQ(train_report("--model tiny --steps 1", "ffn_default")["config"]["model"]["ffn"], 512);
  expect_usage_error("train --model tiny --steps 1 --ffn 0", "--ffn: 0 is out of range: must be between 1 and");
  expect_usage_error("train --model tiny --steps 1 --ffn -3", "--ffn: -3 is out of range: must be between 1 and");
  expect_usage_error("train --model tiny --steps 1 --ffn 383 --tp 2", "must divide the MLP width --ffn = 383");
  expect_usage_error("train --model tiny --steps 1 --ffn abc", "--ffn");
}

TEST(CliShapes, CheckpointsCarryTheShape) {
  const std::string ckpt = tmp("ffn384.safetensors");
  ASSERT_EQ(run_cli("train --model tiny --ffn 384 --steps 1 --save " + ckpt).code, 0);
  const auto meta = nlohmann::json::parse(model::load_safetensors(ckpt).metadata().at(model::kShardlabConfigKey));
  EXPECT_EQ(meta["model"]["ffn"], 384);
  EXPECT_EQ(run_cli("train --model tiny --ffn 384 --steps 1 --init " + ckpt).code, 0);
  expect_usage_error("train --model tiny --steps 1 --init " + ckpt, "transformer.h.0.mlp.c_fc.weight");
  // A difference no tensor shape shows: the heads.
  expect_usage_error("train --model tiny --ffn 384 --heads 8 --steps 1 --init " + ckpt,
                     "the checkpoint has --heads 4, this run 8");
}

TEST(CliShapes, PresetsAndVocabPadding) {
  const auto help = run_cli("train --help");
  for (const char* name : {"gpt3-125m", "gpt3-175b", "megatron-1.7b", "megatron-1t", "nano"})
    EXPECT_NE(help.out.find(name), std::string::npos) << name;
  // GPT-3's 50257 tokens padded to a multiple of 128 x tp (a shrunken model, the same vocabulary).
  const std::string small = "--model gpt3-125m --layers 1 --embd 64 --heads 8 --seq 16 --batch 8 --steps 1";
  auto r = run_cli("train " + small + " --tp 8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("vocab 50257 padded to 51200 (Megatron: multiple of 128 x tp 8)"), std::string::npos)
      << r.out;
  const auto j = train_report(small, "gpt3_tp1");
  EXPECT_EQ(j["config"]["model"]["vocab"], 50304);  // 393 x 128
  EXPECT_EQ(j["config"]["model"]["vocab_unpadded"], 50257);
  EXPECT_EQ(j["config"]["model"]["vocab_padding"], "vocab 50257 padded to 50304 (Megatron: multiple of 128 x tp 1)");
  // Explicit --vocab and the toy presets stay unpadded unless asked.
  EXPECT_EQ(train_report(small + " --vocab 50257", "gpt3_vocab")["config"]["model"]["vocab"], 50257);
  EXPECT_EQ(train_report("--model tiny --vocab 500 --steps 1", "tiny500")["config"]["model"]["vocab"], 500);
  EXPECT_EQ(train_report("--model tiny --vocab 500 --make-vocab-size-divisible-by 64 --steps 1", "tiny512")
                ["config"]["model"]["vocab"],
            512);
  expect_usage_error("train --model tiny --steps 1 --make-vocab-size-divisible-by 0",
                     "--make-vocab-size-divisible-by: 0 is out of range: must be between 1 and");
  expect_usage_error("train --model gpt4 --steps 1", "gpt3-175b");
}

// GPT-3 175B on one A100 in bf16: 18 bytes per parameter before any activation.
TEST(CliShapes, Gpt3OnOneGpuIsRefusedWithItsMixedPrecisionBytes) {
  const double C = 12288, L = 96, V = 50304, T = 2048;
  const double n = V * C + T * C + 2 * C + L * (12 * C * C + 13 * C);
  auto gib = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1ull << 30));
    return std::string(buf);
  };
  expect_usage_error("train --model gpt3-175b --steps 1 --precision bf16",
                     "parameters " + gib(2 * n) + ", gradients " + gib(4 * n) + ", fp32 master weights " +
                         gib(4 * n) + " and optimizer state 1.3 TiB need 2.9 TiB, more than its capacity 80.0 GiB");
}

}  // namespace
}  // namespace shardlab
