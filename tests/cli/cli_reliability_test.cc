// Bad files and lost output: profile files that overflow the device count or
// the time model, checkpoints that do not match the model exactly (strict
// loading), output files written all or none, and write errors on stdout.
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

namespace fs = std::filesystem;
using testing::expect_usage_error;
using testing::run_cli;
using testing::slurp;

// A fresh directory per test; its entries tell whether a run left anything.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(::testing::TempDir() + "reliability_" + name + "_" + std::to_string(getpid())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(CliReliability, ProfileFilesBeyondPhysicalSense) {
  ScratchDir dir("profiles");
  const auto list = nlohmann::json::parse(run_cli("profiles --json").out);
  const nlohmann::json base = list.at(0);
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"overflow", [](auto& j) { j["nodes"] = 1000000, j["devices_per_node"] = 1000000; },
       "nodes 1000000 x devices_per_node 1000000 = 1000000000000 devices: at most 1048576"},
      {"latency", [](auto& j) { j["links"]["inter"]["latency_us"] = 1e300; }, "\"links.inter.latency_us\" must be at most"},
      {"bandwidth", [](auto& j) { j["links"]["intra"]["bandwidth_GBps"] = 1e-300; }, "must be at least 0.001"},
      {"nodes0", [](auto& j) { j["nodes"] = 0; }, "field \"nodes\" must be a positive integer"},
      {"memory", [](auto& j) { j["device"]["memory_GiB"] = -80; }, "\"device.memory_GiB\" must be > 0"},
      {"efficiency", [](auto& j) { j["device"]["compute_efficiency"] = 2; }, "must be in (0, 1]"},
      {"layernorm", [](auto& j) { j["device"]["layernorm_rate"] = {{"fwd", 0.7}, {"bwd", 0}}; },
       "\"device.layernorm_rate.bwd\" must be"},
      {"layernorm_half", [](auto& j) { j["device"]["layernorm_rate"] = {{"fwd", 0.7}}; },
       "missing field \"device.layernorm_rate.bwd\""},
      {"missing", [](auto& j) { j.erase("name"); }, "missing field \"name\""},
      {"array", [](auto& j) { j = nlohmann::json::array(); }, "expected a JSON object"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = base;
    c.edit(j);
    const std::string path = dir.file(std::string(c.name) + ".json");
    write(path, j.dump());
    expect_usage_error("p2p --max-bytes 8 --profile " + path, c.needle);
  }
}

// Strict loading, as PyTorch's load_state_dict(strict=True).
TEST(CliReliability, CheckpointsMustMatchTheModelExactly) {
  ScratchDir dir("ckpt");
  const std::string good = dir.file("nano.safetensors"), deeper = dir.file("nano3.safetensors");
  ASSERT_EQ(run_cli("train --model nano --steps 1 --save " + good).code, 0);
  ASSERT_EQ(run_cli("train --model nano --layers 3 --steps 1 --save " + deeper).code, 0);
  EXPECT_EQ(run_cli("train --model nano --steps 1 --init " + good).code, 0);
  // A shardlab checkpoint names the flag that differs.
  expect_usage_error("train --model nano --steps 1 --init " + deeper, "the checkpoint has --layers 3, this run 2");

  // The same files without shardlab's metadata, as another tool would write them.
  auto variant = [&](const std::string& name, const std::string& from, auto edit) {
    const model::SafetensorsFile f = model::load_safetensors(from);
    std::map<std::string, std::vector<float>> data;
    std::map<std::string, Shape> shapes;
    for (const std::string& n : f.names()) data[n] = f.at(n).data, shapes[n] = f.at(n).shape;
    edit(data, shapes);
    std::vector<model::NamedTensorView> views;
    for (const auto& [n, d] : data) views.push_back({n, shapes[n], d.data()});
    const std::string path = dir.file(name);
    model::save_safetensors(path, views);
    return path;
  };
  auto none = [](auto&, auto&) {};
  expect_usage_error("train --model nano --steps 1 --init " + variant("deeper.st", deeper, none),
                     "unexpected tensor \"transformer.h.2.attn.c_attn.bias\" (not in this model");
  expect_usage_error("train --model nano --steps 1 --init " +
                         variant("extra.st", good, [](auto& d, auto& s) { d["optimizer.step"] = {1}, s["optimizer.step"] = {1}; }),
                     "unexpected tensor \"optimizer.step\"");
  expect_usage_error("train --model nano --steps 1 --init " +
                         variant("missing.st", good, [](auto& d, auto&) { d.erase("transformer.ln_f.bias"); }),
                     "missing tensor \"transformer.ln_f.bias\"");
  expect_usage_error("train --model nano --steps 1 --init " + variant("shape.st", good,
                                                                    [](auto& d, auto& s) {
                                                                      s["transformer.ln_f.bias"] = {32};
                                                                      d["transformer.ln_f.bias"].resize(32);
                                                                    }),
                     "tensor \"transformer.ln_f.bias\" has shape");
  write(dir.file("garbage.st"), "not a checkpoint");
  expect_usage_error("train --model nano --steps 1 --init " + dir.file("garbage.st"), "truncated");
}

// A bad path among good ones: found before the run, and nothing is written.
TEST(CliReliability, ABadOutputPathLeavesNoFiles) {
  ScratchDir dir("bad_trace");
  write(dir.file("report.json"), "an earlier run's report\n");
  expect_usage_error("train --model nano --steps 1 --save " + dir.file("ckpt.safetensors") + " --report " +
                         dir.file("report.json") + " --trace " + dir.file("missing/trace.json"),
                     "--trace \"" + dir.file("missing/trace.json") + "\": cannot write: directory");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"report.json"});
  EXPECT_EQ(slurp(dir.file("report.json")), "an earlier run's report\n");
}

// A write that fails after the run (a full device) takes the others with it.
TEST(CliReliability, AFailedWriteAfterTheRunLeavesNoFiles) {
  ScratchDir dir("full");
  const auto r = run_cli("train --model nano --steps 1 --json --save " + dir.file("ckpt.safetensors") +
                         " --trace " + dir.file("trace.json") + " --report /dev/full");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--report \"/dev/full\": cannot write: No space left on device"), std::string::npos) << r.err;
  EXPECT_TRUE(dir.entries().empty()) << dir.entries().front();
}

TEST(CliReliability, AFinishedRunWritesEveryFileWhole) {
  ScratchDir dir("good");
  const auto r = run_cli("train --model nano --steps 3 --save " + dir.file("ckpt.safetensors") + " --report " +
                         dir.file("report.json") + " --trace " + dir.file("trace.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors", "report.json", "trace.json"}));
  const auto report = nlohmann::json::parse(slurp(dir.file("report.json")));
  EXPECT_EQ(report["steps"].size(), 3u);
  const auto trace = nlohmann::json::parse(slurp(dir.file("trace.json")));
  EXPECT_FALSE(trace["traceEvents"].empty());
  const model::SafetensorsFile ckpt = model::load_safetensors(dir.file("ckpt.safetensors"));
  EXPECT_EQ(int64_t(ckpt.size()), 2 * 12 + 4);  // nano: 2 blocks of 12 tensors, wte, wpe, ln_f
  // /dev/null is written in place, never replaced.
  EXPECT_EQ(run_cli("train --model nano --steps 1 --report /dev/null").code, 0);
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

// Output lost on stdout is a failure: exit 2 and one error line on stderr,
// the last (a run without --json prints its progress there before it).
TEST(CliReliability, WriteErrorsOnStdoutAreDetected) {
  const std::string err = ::testing::TempDir() + "stdout_full_" + std::to_string(getpid()) + ".err";
  for (const char* args : {"train --model nano --steps 1 --json", "train --model nano --steps 1",
                           "verify --model nano --steps 1 --json", "profiles --json", "profiles",
                           "collectives --ranks 2 --max-bytes 64", "p2p --max-bytes 64 --json", "train --help"}) {
    const int status = std::system((std::string(SHARDLAB_BIN) + " " + args + " >/dev/full 2>" + err).c_str());
    const std::string text = slurp(err);
    ASSERT_TRUE(WIFEXITED(status)) << args;
    EXPECT_EQ(WEXITSTATUS(status), 2) << args << "\n" << text;
    int error_lines = 0;
    std::string line, last;
    for (std::istringstream in(text); std::getline(in, line); last = line) error_lines += line.find("error") != std::string::npos;
    EXPECT_EQ(error_lines, 1) << args << "\n" << text;
    EXPECT_EQ(last.rfind("shardlab: error: cannot write to stdout", 0), 0u) << args << "\n" << text;
  }
}

}  // namespace
}  // namespace shardlab
