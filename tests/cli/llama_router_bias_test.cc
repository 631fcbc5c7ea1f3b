// Aux-loss-free balancing (`--router-bias-rate`, DeepSeek-V3): the update of
// the per-expert selection bias checked by hand from a run's own expert
// loads, the bias saved under DeepSeek's Hugging Face name and resumed, and
// the refusals. Sharded == unsharded with the bias is llama_verify_test's.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;

std::string scratch(const std::string& name) {
  const std::string d = ::testing::TempDir() + "router_bias_" + std::to_string(getpid()) + "_" + name;
  fs::remove_all(d);
  return d;
}

// The fp32 tensors of a safetensors file (8-byte header length, JSON header,
// data), read independently of shardlab's reader.
std::map<std::string, std::vector<float>> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, std::vector<float>> out;
  const nlohmann::json tensors = nlohmann::json::parse(header);
  for (const auto& [name, t] : tensors.items()) {
    if (name == "__metadata__" || t.at("dtype") != "F32") continue;
    const auto begin = t.at("data_offsets")[0].get<size_t>(), end = t.at("data_offsets")[1].get<size_t>();
    std::vector<float> v((end - begin) / 4);
    std::memcpy(v.data(), data.data() + begin, end - begin);
    out[name] = std::move(v);
  }
  return out;
}

const std::string kRun = "train --model tiny-moe --batch 4 --seq 32 --seed 3 --router-bias-rate 0.01 --json ";

// After one step, b_e = 0 + rate · sign(mean load − load_e) in every MoE
// block, with load_e the step's tokens routed to expert e (the report's
// tokens_per_expert: no capacity, so nothing dropped) and mean = N·K/E =
// 4·32·2/8 = 32. Tolerance: exact (the update is ±rate or 0 from zero).
TEST(RouterBias, OneStepMovesEachExpertsBiasByTheSignOfItsLoad) {
  const std::string f = scratch("one.safetensors");
  const auto r = run_cli(kRun + "--steps 1 --save " + f);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto report = nlohmann::json::parse(r.out);
  const auto tensors = read_safetensors(f);
  ASSERT_EQ(report.at("moe").size(), 3u);  // blocks 1..3 (block 0 dense)
  int moved = 0;
  for (const auto& m : report["moe"]) {
    const int l = m.at("layer").get<int>();
    const auto loads = m.at("tokens_per_expert")[0].get<std::vector<int64_t>>();
    const auto it = tensors.find("model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias");
    ASSERT_NE(it, tensors.end()) << "layer " << l;
    ASSERT_EQ(loads.size(), 8u);
    ASSERT_EQ(it->second.size(), 8u);
    int64_t total = 0;
    for (int64_t x : loads) total += x;
    EXPECT_EQ(total, 4 * 32 * 2);
    for (size_t e = 0; e < 8; ++e) {
      const float want = loads[e] < 32 ? 0.01f : (loads[e] > 32 ? -0.01f : 0.0f);
      EXPECT_EQ(it->second[e], want) << "layer " << l << " expert " << e << " load " << loads[e];
      moved += want != 0;
    }
  }
  EXPECT_GT(moved, 0);
  std::printf("one step: %d of 24 biases moved by +-0.01, each as its load's sign says\n", moved);
  EXPECT_EQ(tensors.count("model.layers.0.mlp.gate.e_score_correction_bias"), 0u);  // dense block
  fs::remove(f);
}

// The bias steers later routing: the losses after step 0 differ from a run
// without it, and a run resumed from a checkpoint of step 2 ends where the
// uninterrupted one does (the bias is in the checkpoint).
TEST(RouterBias, ChangesRoutingAndIsResumedFromCheckpoints) {
  const std::string d = scratch("ckpt");
  const auto straight = run_cli(kRun + "--steps 4 --checkpoint-dir " + d + " --checkpoint-every 2");
  ASSERT_EQ(straight.code, 0) << straight.err;
  const auto off = run_cli("train --model tiny-moe --batch 4 --seq 32 --seed 3 --json --steps 4");
  ASSERT_EQ(off.code, 0) << off.err;
  fs::remove_all(d + "/step-000004");
  std::ofstream(d + "/latest") << "step-000002\n";
  const auto resumed = run_cli(kRun + "--steps 4 --resume " + d);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const auto a = nlohmann::json::parse(straight.out), b = nlohmann::json::parse(resumed.out),
             c = nlohmann::json::parse(off.out);
  ASSERT_EQ(b["steps"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a["steps"][i]["loss"], b["steps"][i]["loss"]) << i;
  EXPECT_EQ(a["steps"][0]["loss"], c["steps"][0]["loss"]);  // the bias starts at zero
  EXPECT_NE(a["steps"][3]["loss"], c["steps"][3]["loss"]);
  std::printf("step 3 loss %.6f with the bias, %.6f without; resumed %.6f\n", a["steps"][3]["loss"].get<double>(),
              c["steps"][3]["loss"].get<double>(), b["steps"][3]["loss"].get<double>());
  fs::remove_all(d);
}

TEST(RouterBias, RefusedWhereItMeansNothing) {
  testing::expect_usage_error("train --model tiny-llama --router-bias-rate 0.01", "--router-bias-rate");
  testing::expect_usage_error("train --model tiny-moe --moe-top-k 8 --router-bias-rate 0.01", "--router-bias-rate");
  testing::expect_usage_error("train --model tiny-moe --router-bias-rate -0.5", "--router-bias-rate");
  testing::expect_usage_error("generate --model tiny-moe --router-bias-rate 0.01", "--router-bias-rate");
}

}  // namespace
}  // namespace shardlab
