// `shardlab sweep`: a small grid of tiny runs end to end, failed points as
// rows, and the sweep-level inputs it refuses (one line, exit 2).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::count_lines;
using testing::expect_usage_error;
using testing::run_cli;
using testing::slurp;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "sweep_" + std::to_string(getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

bool gnuplot_installed() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

TEST(CliSweep, TinyGridWritesEveryPointAndPlots) {
  const std::string dir = fresh_dir("grid");
  const auto r = run_cli("sweep --model tiny --steps 1 --vary batch=2,4 --vary 'tp=2,pp=1|tp=1,pp=2' "
                         "--metric virtual_step_s --metric peak_memory_bytes --jobs 2 --plot --out " + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("4/4 points"), std::string::npos) << r.err;
  const std::string csv = slurp(dir + "/points.csv");
  EXPECT_EQ(count_lines(csv), 5) << csv;
  EXPECT_EQ(csv.rfind("point,batch,tp,pp,virtual_step_s,peak_memory_bytes,error,wall_s\n", 0), 0u) << csv;
  const auto j = nlohmann::json::parse(slurp(dir + "/points.json"));
  ASSERT_EQ(j["points"].size(), 4u);
  // The first axis varies fastest; point 3 is batch 4 on two pipeline stages.
  EXPECT_EQ(j["points"][3]["config"], nlohmann::json({{"batch", "4"}, {"tp", "1"}, {"pp", "2"}}));
  // Each point is the run `train` gives for its flags, to the picosecond.
  const std::string report = dir + "/train_report.json";
  ASSERT_EQ(run_cli("train --model tiny --steps 1 --batch 4 --pp 2 --report " + report).code, 0);
  const auto t = nlohmann::json::parse(slurp(report));
  EXPECT_EQ(j["points"][3]["metrics"]["virtual_step_s"], t["summary"]["virtual_step_s"]);
  uint64_t peak = 0;
  for (const auto& d : t["devices"]) peak = std::max(peak, d["peak_bytes"].get<uint64_t>());
  EXPECT_EQ(j["points"][3]["metrics"]["peak_memory_bytes"].get<double>(), double(peak));
  for (const char* metric : {"virtual_step_s", "peak_memory_bytes"}) {
    const std::string stem = dir + "/" + metric;
    EXPECT_NE(slurp(stem + ".gp").find("set terminal svg"), std::string::npos) << metric;
    EXPECT_NE(slurp(stem + ".dat").find("# tp=1,pp=2"), std::string::npos) << metric;
    if (!gnuplot_installed()) continue;
    EXPECT_EQ(slurp(stem + ".png").rfind("\x89PNG", 0), 0u) << stem << ".png";
    EXPECT_NE(slurp(stem + ".svg").find("<svg"), std::string::npos) << stem << ".svg";
  }
}

// --vary attention-kernel: each point selects its kernel from the profile
// (a point is the train run of its flags, to the picosecond); a name the
// profile lacks fails that point only.
TEST(CliSweep, VariesTheAttentionKernel) {
  const std::string dir = fresh_dir("kernels");
  const std::string model = " --model tiny-llama --steps 1 --phantom --profile h100-nvlink --precision bf16 --seq 4096";
  const auto r = run_cli("sweep" + model + " --vary attention-kernel=cudnn,fa2,fa9 --out " + dir);
  ASSERT_EQ(r.code, 0) << r.err;  // one point failed, the others ran
  const auto j = nlohmann::json::parse(slurp(dir + "/points.json"));
  ASSERT_EQ(j["points"].size(), 3u);
  for (int i = 0; i < 2; ++i) {
    const std::string report = dir + "/k" + std::to_string(i) + ".json";
    ASSERT_EQ(run_cli("train" + model + " --attention-kernel " + (i ? "fa2" : "cudnn") + " --report " + report).code, 0);
    EXPECT_EQ(j["points"][i]["metrics"]["virtual_step_s"],
              nlohmann::json::parse(slurp(report))["summary"]["virtual_step_s"]);
  }
  EXPECT_GT(j["points"][1]["metrics"]["virtual_step_s"].get<double>(),
            j["points"][0]["metrics"]["virtual_step_s"].get<double>());
  EXPECT_NE(j["points"][2]["error"].get<std::string>().find("fa9"), std::string::npos) << j["points"][2];
}

// --vary recompute-modules: a list of modules is one value when joined by +
// (a sweep's values are split at commas); each point keeps less activation
// memory and takes longer than the one before, and is train's run of it.
TEST(CliSweep, VariesTheRecomputedModules) {
  const std::string dir = fresh_dir("recompute_modules");
  const std::string model = " --model tiny-moe --steps 1 --ep 2 --dp 2";
  const auto r = run_cli("sweep" + model +
                         " --vary recompute-modules=moe_act,layernorm+moe_act,moe --metric virtual_step_s "
                         "--metric peak_activation_bytes --out " + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(slurp(dir + "/points.json"));
  ASSERT_EQ(j["points"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(j["points"][i].contains("metrics")) << j["points"][i];
    if (i == 0) continue;
    const auto& m = j["points"][i]["metrics"];
    const auto& before = j["points"][i - 1]["metrics"];
    EXPECT_LT(m["peak_activation_bytes"].get<double>(), before["peak_activation_bytes"].get<double>()) << i;
    EXPECT_GT(m["virtual_step_s"].get<double>(), before["virtual_step_s"].get<double>()) << i;
  }
  const std::string report = dir + "/both.json";
  ASSERT_EQ(run_cli("train" + model + " --recompute-modules moe_act,layernorm --report " + report).code, 0);
  EXPECT_EQ(j["points"][1]["metrics"]["virtual_step_s"],
            nlohmann::json::parse(slurp(report))["summary"]["virtual_step_s"]);
}

TEST(CliSweep, FailedPointsAreRowsAndTheSweepGoesOn) {
  const std::string dir = fresh_dir("bad_points");
  // tp 3 does not divide tiny's 4 heads; "two" is not a number; --memory 1MiB cannot hold tiny.
  const auto r = run_cli("sweep --model tiny --steps 1 --vary tp=1,3,two --vary memory=1GiB,1MiB --out " + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("5 failed"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(slurp(dir + "/points.json"));
  ASSERT_EQ(j["points"].size(), 6u);
  EXPECT_TRUE(j["points"][0].contains("metrics")) << j["points"][0];
  EXPECT_NE(j["points"][1]["error"].get<std::string>().find("--tp"), std::string::npos) << j["points"][1];
  EXPECT_NE(j["points"][2]["error"].get<std::string>().find("two"), std::string::npos) << j["points"][2];
  EXPECT_NE(j["points"][3]["error"].get<std::string>().find("out of memory"), std::string::npos) << j["points"][3];
  const std::string csv = slurp(dir + "/points.csv");
  EXPECT_EQ(count_lines(csv), 7) << csv;
  EXPECT_NE(csv.find("\n3,1,1MiB,,"), std::string::npos) << csv;  // no metric, then the error
  // When no point runs, the sweep says so with exit 1.
  EXPECT_EQ(run_cli("sweep --model tiny --steps 1 --vary tp=3,5 --out " + dir).code, 1);
}

// An on/off flag is an axis too: true gives the flag, false leaves it out,
// and each point is the run `train` gives with or without it.
TEST(CliSweep, OnOffFlagsAreAxes) {
  const std::string dir = fresh_dir("on_off");
  const auto r = run_cli("sweep --model tiny --steps 1 --dp 2 --bucket-mb 1 --vary no-overlap=false,true,maybe --out " + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("1 failed"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(slurp(dir + "/points.json"));
  ASSERT_EQ(j["points"].size(), 3u);
  for (int on = 0; on < 2; ++on) {
    const std::string report = dir + "/train_" + std::to_string(on) + ".json";
    ASSERT_EQ(run_cli("train --model tiny --steps 1 --dp 2 --bucket-mb 1 --report " + report + (on ? " --no-overlap" : "")).code, 0);
    const auto t = nlohmann::json::parse(slurp(report));
    EXPECT_EQ(j["points"][on]["metrics"]["virtual_step_s"], t["summary"]["virtual_step_s"]) << on;
  }
  EXPECT_NE(j["points"][0]["metrics"]["virtual_step_s"], j["points"][1]["metrics"]["virtual_step_s"]);
  EXPECT_NE(j["points"][2]["error"].get<std::string>().find(
                "--no-overlap is an on/off flag: vary it over true and false, not \"maybe\""),
            std::string::npos)
      << j["points"][2];
}

TEST(CliSweep, WithoutGnuplotTheDataStillComesAndOneLineSaysHow) {
  const std::string dir = fresh_dir("no_gnuplot");
  const std::string empty = fresh_dir("empty_path");
  std::filesystem::create_directories(empty);
  const std::string saved = std::getenv("PATH") ? std::getenv("PATH") : "";
  setenv("PATH", empty.c_str(), 1);
  const auto r = run_cli("sweep --model tiny --steps 1 --vary batch=2,4 --plot --out " + dir);
  setenv("PATH", saved.c_str(), 1);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("gnuplot not found"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("apt-get install gnuplot-nox"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/points.csv"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/virtual_step_s.gp"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/virtual_step_s.png"));
}

TEST(CliSweep, BadSweepInputIsOneLineBeforeAnythingRuns) {
  const std::string dir = fresh_dir("refused");
  const std::string base = "sweep --model tiny --steps 1 --out " + dir + " ";
  expect_usage_error(base + "--vary batch", "expected NAME=V1,V2");
  expect_usage_error(base + "--vary batch=", "empty value");
  expect_usage_error(base + "--vary batch=1,,2", "empty value");
  expect_usage_error(base + "--vary 'tp=2,pp=1|tp=1'", "does not set the same flags");
  expect_usage_error(base + "--vary bogus=1,2", "unknown axis \"bogus\"");
  expect_usage_error(base + "--vary report=a.json,b.json", "unknown axis \"report\"");
  expect_usage_error(base + "--vary micro-batch=1,2", "--vary: unknown axis \"micro-batch\" (did you mean micro-batches?)");
  expect_usage_error(base + "--vary tp=1,2 --vary 'tp=4,pp=1|tp=1,pp=4'", "tp is varied by two axes");
  expect_usage_error(base + "--vary tp=1,2 --tp 2", "--tp is given as a flag and varied");
  expect_usage_error(base + "--vary batch=2,4 --metric speed", "--metric: unknown \"speed\"");
  expect_usage_error(base + "--vary batch=2,4 --report r.json", "the sweep writes its points to --out");
  expect_usage_error(base + "--vary batch=2,4 --jobs 0", "--jobs must be at least 1");
  expect_usage_error(base, "at least one --vary");
  expect_usage_error("sweep --model tiny --vary batch=2,4", "--out");
  EXPECT_FALSE(std::filesystem::exists(dir)) << "nothing runs, nothing is written";
  // An --out that cannot be a directory: under a regular file.
  const std::string file = fresh_dir("a_file");
  { std::ofstream(file) << "x"; }
  expect_usage_error("sweep --model tiny --vary batch=2,4 --out " + file + "/sub", "--out: cannot write");
}

}  // namespace
}  // namespace shardlab
