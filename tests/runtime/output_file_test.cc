// Output files: checked before a run, written all or none after it.
#include "runtime/output_file.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/errors.h"

namespace shardlab {
namespace {

namespace fs = std::filesystem;

class OutputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "output_file_" + std::to_string(getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  static std::string read(const std::string& p) {
    std::stringstream ss;
    ss << std::ifstream(p).rdbuf();
    return ss.str();
  }
  // The one-line message of the ConfigError `f` throws ("" if none).
  template <class F>
  static std::string error_of(F f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }

  std::string dir_;
};

TEST_F(OutputFile, CheckWritableNamesTheFlagAndTheProblemAndCreatesNothing) {
  EXPECT_EQ(error_of([&] { check_writable(path("r.json"), "--report"); }), "");
  EXPECT_EQ(error_of([&] { check_writable(dir_, "--report"); }),
            "--report \"" + dir_ + "\": cannot write: it is a directory");
  EXPECT_EQ(error_of([&] { check_writable(path("no/r.json"), "--trace"); }),
            "--trace \"" + path("no/r.json") + "\": cannot write: directory \"" + path("no") + "\" does not exist");
  std::ofstream(path("plain")) << "x";
  EXPECT_EQ(error_of([&] { check_writable(path("plain/r.json"), "--save"); }),
            "--save \"" + path("plain/r.json") + "\": cannot write: \"" + path("plain") + "\" is not a directory");
  EXPECT_EQ(error_of([&] { check_writable("", "--save"); }), "--save: empty file name");
  EXPECT_EQ(entries(), std::vector<std::string>{"plain"});  // the probe file is gone
}

TEST_F(OutputFile, TwoFlagsNamingOneFileAreRefused) {
  EXPECT_EQ(error_of([&] { check_distinct_outputs({{"--report", path("a")}, {"--trace", dir_ + "/./a"}}); }),
            "--report and --trace both write \"" + path("a") + "\" (one would overwrite the other)");
  EXPECT_EQ(error_of([&] { check_distinct_outputs({{"--report", path("a")}, {"--trace", ""}, {"--save", ""}}); }), "");
  // /dev/null is written in place: several outputs may go there.
  EXPECT_EQ(error_of([&] { check_distinct_outputs({{"--report", "/dev/null"}, {"--trace", "/dev/null"}}); }), "");
}

TEST_F(OutputFile, AStagedFileAppearsOnlyOnCommitAndAnUncommittedOneLeavesNothing) {
  std::ofstream(path("r.json")) << "old";
  {
    StagedFile f(path("r.json"), "new", "--report");
    EXPECT_EQ(read(path("r.json")), "old");  // not yet
    EXPECT_EQ(entries().size(), 2u);         // the temporary file, in the same directory
    f.commit();
  }
  EXPECT_EQ(read(path("r.json")), "new");
  { StagedFile abandoned(path("r.json"), "never", "--report"); }
  EXPECT_EQ(read(path("r.json")), "new");
  EXPECT_EQ(entries(), std::vector<std::string>{"r.json"});
}

TEST_F(OutputFile, OneFailingFileTakesTheOthersWithIt) {
  std::vector<StagedFile> staged;
  staged.emplace_back(path("ckpt"), "weights", "--save");
  const std::string error = error_of([&] { staged.emplace_back("/dev/full", "report", "--report"); });
  EXPECT_EQ(error, "--report \"/dev/full\": cannot write: No space left on device");
  staged.clear();  // the caller unwinds: nothing was committed
  EXPECT_TRUE(entries().empty());
}

TEST_F(OutputFile, ASymbolicLinkIsFollowedNotReplaced) {
  fs::create_directories(path("real"));
  std::ofstream(path("real/r.json")) << "old";
  fs::create_symlink(path("real/r.json"), path("link.json"));
  write_file_atomic(path("link.json"), "through the link", "--report");
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_EQ(read(path("real/r.json")), "through the link");
}

}  // namespace
}  // namespace shardlab
