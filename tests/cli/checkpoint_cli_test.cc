// `train --checkpoint-dir D --checkpoint-every N` and `--resume D` from the
// command line: the directory layout, a resumed command line ending where the
// uninterrupted one does, and every bad checkpoint or flag refused with one
// line on stderr and exit 2 (table-driven).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

namespace fs = std::filesystem;
using testing::expect_usage_error;
using testing::run_cli;
using testing::slurp;

const std::string kBase = "--model nano --batch 4";
const std::string kModel = kBase + " --layers 2 --steps 4";

std::string scratch(const std::string& name) {
  const std::string d = ::testing::TempDir() + "ckpt_cli_" + name + "_" + std::to_string(getpid());
  fs::remove_all(d);
  return d;
}

void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// One good checkpoint (tp 2, every 2 steps) shared by the tests, copied
// before each corruption.
class CheckpointCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    good_ = new std::string(scratch("good"));
    const auto r = run_cli("train " + kModel + " --tp 2 --checkpoint-dir " + *good_ + " --checkpoint-every 2 --json");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*good_);
    delete good_;
  }
  // A copy of the good checkpoint, `edit` applied to its step-000004 directory.
  static std::string broken(const std::string& name, const std::function<void(const fs::path&)>& edit) {
    const std::string d = scratch(name);
    fs::copy(*good_, d, fs::copy_options::recursive);
    edit(fs::path(d) / "step-000004");
    return d;
  }
  static std::string* good_;
};
std::string* CheckpointCli::good_ = nullptr;

TEST_F(CheckpointCli, LayoutIsStepDirectoriesAnIndexAndOneFilePerDevice) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(*good_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-000002", "step-000004"}));
  EXPECT_EQ(slurp(*good_ + "/latest"), "step-000004\n");
  const auto index = nlohmann::json::parse(slurp(*good_ + "/step-000004/index.json"));
  EXPECT_EQ(index["step"], 4);
  EXPECT_EQ(index["world"], 2);
  EXPECT_EQ(index["devices"].size(), 2u);
  EXPECT_EQ(index["steps"].size(), 4u);
  EXPECT_EQ(index["data"]["next_step"], 4);
  EXPECT_EQ(index["config"]["parallel"]["tp"], 2);
  EXPECT_EQ(index["tensors"]["transformer.wte.weight"]["shape"], nlohmann::json({256, 64}));
  for (const char* f : {"rank-00000.safetensors", "rank-00001.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(*good_ + "/step-000004/" + f)) << f;
  // tp rank 1 holds rows [128, 256) of the vocab-parallel wte.
  bool found = false;
  for (const auto& e : index["shards"])
    if (e["tensor"] == "transformer.wte.weight" && e["state"] == "param" && e["file"] == "rank-00001.safetensors") {
      EXPECT_EQ(e["ranges"], nlohmann::json::parse("[[128, 128]]"));
      found = true;
    }
  EXPECT_TRUE(found);
}

TEST_F(CheckpointCli, ResumedCommandLineEndsWhereTheUninterruptedOneDoes) {
  const std::string d = scratch("resume");
  fs::copy(*good_, d, fs::copy_options::recursive);
  fs::remove_all(d + "/step-000004");
  write(d + "/latest", "step-000002\n");
  const auto straight = run_cli("train " + kModel + " --tp 2 --json");
  const auto resumed = run_cli("train " + kModel + " --tp 2 --resume " + d + " --json");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const auto a = nlohmann::json::parse(straight.out), b = nlohmann::json::parse(resumed.out);
  ASSERT_EQ(b["steps"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a["steps"][i]["loss"], b["steps"][i]["loss"]) << i;
    EXPECT_EQ(a["steps"][i]["virtual_time_s"], b["steps"][i]["virtual_time_s"]) << i;
  }
  EXPECT_EQ(a["summary"]["virtual_step_s"], b["summary"]["virtual_step_s"]);
  fs::remove_all(d);
}

// A crash while writing step 6 left a partial directory; a rerun that died
// between its two renames left step 4 as .old-step-000004. The last good
// checkpoint still resumes, and the next run cleans up.
TEST_F(CheckpointCli, InterruptedWritesLeaveTheLastGoodCheckpoint) {
  const std::string d = scratch("interrupted");
  fs::copy(*good_, d, fs::copy_options::recursive);
  fs::create_directories(d + "/.partial-step-000006");
  write(d + "/.partial-step-000006/rank-00000.safetensors", "half a file");
  fs::rename(d + "/step-000004", d + "/.old-step-000004");
  const auto r = run_cli("train " + kBase + " --layers 2 --steps 6 --tp 2 --resume " + d + " --checkpoint-dir " + d +
                         " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-000002", "step-000004", "step-000006"}));
  EXPECT_EQ(slurp(d + "/latest"), "step-000006\n");
  EXPECT_EQ(nlohmann::json::parse(r.out)["steps"].size(), 6u);
  fs::remove_all(d);
}

struct BadCase {
  const char* name;
  std::function<std::string(const std::string& good)> args;  // the flags after `train`
  const char* needle;
};

TEST_F(CheckpointCli, BadCheckpointsAndFlagsAreOneLineExit2) {
  const std::string tp2 = "train " + kModel + " --tp 2 ";
  auto resume = [&](const std::string& name, std::function<void(const fs::path&)> edit) {
    return tp2 + "--resume " + broken(name, std::move(edit));
  };
  auto edit_index = [](std::function<void(nlohmann::json&)> f) {
    return [f](const fs::path& p) {
      auto j = nlohmann::json::parse(slurp((p / "index.json").string()));
      f(j);
      write(p / "index.json", j.dump());
    };
  };
  const std::string refused_dir = scratch("e0");
  const std::string file_path = scratch("a_file");
  write(file_path, "x");
  const std::vector<BadCase> cases = {
      {"missing index", [&](auto&) { return resume("noindex", [](auto& p) { fs::remove(p / "index.json"); }); },
       "step-000004 has no index.json"},
      {"corrupt index", [&](auto&) { return resume("badjson", [](auto& p) { write(p / "index.json", "{\"step\": 4,"); }); },
       "index.json is not valid JSON"},
      {"index without steps", [&](auto&) { return resume("nosteps", edit_index([](auto& j) { j.erase("steps"); })); },
       "index.json: [json.exception"},
      {"index of another format", [&](auto&) { return resume("format", edit_index([](auto& j) { j["format"] = "dcp"; })); },
       "not a shardlab-checkpoint version 1 index"},
      {"missing shard file",
       [&](auto&) { return resume("noshard", [](auto& p) { fs::remove(p / "rank-00001.safetensors"); }); },
       "rank-00001.safetensors\": no such file"},
      {"truncated shard file",
       [&](auto&) {
         return resume("truncated", [](auto& p) { fs::resize_file(p / "rank-00000.safetensors", 1000); });
       },
       "rank-00000.safetensors"},
      {"shard entry dropped",
       [&](auto&) { return resume("dropped", edit_index([](auto& j) { j["shards"].erase(0); })); },
       "no shard holds param of \"transformer.wte.weight\""},
      {"shard entry outside its tensor",
       [&](auto&) {
         return resume("outside", edit_index([](auto& j) { j["shards"][0]["ranges"] = {{200, 128}}; }));
       },
       "a range lies outside the tensor"},
      {"shard file outside the checkpoint",
       [&](auto&) {
         return resume("escape", edit_index([](auto& j) { j["shards"][0]["file"] = "../latest"; }));
       },
       "is not in the checkpoint's directory"},
      // Found in session 34 by hand-edited indexes: numbers of another kind
      // were truncated or wrapped (step 1.5 resumed as step 1; 1e30 read as
      // INT_MIN), and an index without device entries resumed with the
      // clock at 0 (every later time wrong).
      {"a fractional step", [&](auto&) { return resume("step_float", edit_index([](auto& j) { j["step"] = 1.5; })); },
       "index.json: step is 1.5: expected an integer from 1 to 2147483647"},
      {"a step beyond int", [&](auto&) { return resume("step_huge", edit_index([](auto& j) { j["step"] = 1e30; })); },
       "index.json: step is 1e+30: expected an integer"},
      {"a negative clock",
       [&](auto&) {
         return resume("clock", edit_index([](auto& j) { j["devices"][1]["clock"]["comm_ps"] = -5; }));
       },
       "comm_ps is -5: expected an integer from 0"},
      {"no device entries", [&](auto&) { return resume("nodevices", edit_index([](auto& j) { j["devices"] = nlohmann::json::array(); })); },
       "index.json: 0 device entries for a world of 2"},
      {"a world of 0", [&](auto&) { return resume("world0", edit_index([](auto& j) { j["world"] = 0; })); },
       "index.json: world is 0: expected an integer from 1"},
      {"a step record out of order",
       [&](auto&) { return resume("order", edit_index([](auto& j) { j["steps"][2]["step"] = 7; })); },
       "index.json: step record 2 says step 7"},
      {"a fractional range", [&](auto&) {
         return resume("range_float", edit_index([](auto& j) { j["shards"][0]["ranges"] = {{0.5, 128}}; }));
       },
       "a range's start is 0.5: expected an integer from 0"},
      {"latest names no checkpoint",
       [&](auto&) { return resume("latest", [](auto& p) { write(p.parent_path() / "latest", "../etc\n"); }); },
       "\"latest\" names \"../etc\""},
      {"another model", [&](auto& g) { return "train " + kBase + " --layers 3 --steps 4 --tp 2 --resume " + g; },
       "the checkpoint has --layers 2, this run 3"},
      {"heads of another size",
       [&](auto& g) { return "train " + kBase + " --layers 2 --steps 5 --tp 2 --family llama --head-dim 8 --resume " + g; },
       "the checkpoint has --head-dim"},
      {"more steps done than --steps", [&](auto& g) { return "train " + kBase + " --layers 2 --steps 3 --tp 2 --resume " + g; },
       "the checkpoint is at step 4 but --steps is 3"},
      {"empty directory",
       [&](auto&) {
         const std::string d = scratch("empty");
         fs::create_directories(d);
         return tp2 + "--resume " + d;
       },
       "no checkpoint in it"},
      {"missing directory", [&](auto&) { return tp2 + "--resume " + scratch("nowhere"); }, "no such directory"},
      {"--checkpoint-every 0", [&](auto&) { return tp2 + "--checkpoint-dir " + refused_dir + " --checkpoint-every 0"; },
       "--checkpoint-every: 0 is out of range: must be between 1 and 1000000"},
      {"--checkpoint-every -2",
       [&](auto&) { return tp2 + "--checkpoint-dir " + scratch("e2") + " --checkpoint-every=-2"; },
       "--checkpoint-every: -2 is out of range"},
      {"--checkpoint-every without a directory", [&](auto&) { return tp2 + "--checkpoint-every 2"; },
       "--checkpoint-every needs --checkpoint-dir"},
      {"--checkpoint-dir under a file", [&](auto&) { return tp2 + "--checkpoint-dir " + file_path + "/sub"; },
       "cannot be created"},
      {"--checkpoint-dir is a file", [&](auto&) { return tp2 + "--checkpoint-dir " + file_path; },
       "not a directory and cannot be created"},
      {"--init with --resume", [&](auto& g) { return tp2 + "--init x.safetensors --resume " + g; },
       "--init and --resume cannot be combined"},
      {"phantom checkpoint", [&](auto&) { return "train " + kModel + " --phantom --checkpoint-dir " + scratch("ph"); },
       "cannot be combined with --phantom"},
      {"phantom resume", [&](auto& g) { return "train " + kModel + " --phantom --resume " + g; },
       "cannot be combined with --phantom"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    expect_usage_error(c.args(*good_), c.needle);
  }
  EXPECT_FALSE(fs::exists(refused_dir)) << "a refused run creates no checkpoint directory";
}

}  // namespace
}  // namespace shardlab
