// Input files: one line for each way a path is not a readable file, and the
// whole of a file that is.
#include "runtime/input_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/errors.h"

namespace shardlab {
namespace {

namespace fs = std::filesystem;

class InputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "input_file_" + std::to_string(getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // The error of reading `p` (at most `max` bytes), "" when it reads.
  static std::string error_of(const std::string& p, size_t max = 1 << 20) {
    try {
      read_input("--flag " + p, p, "a text file", max);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

TEST_F(InputFile, ReadsEveryByte) {
  std::string bytes(200000, 'a');  // more than one read chunk, with a NUL and a CR inside
  bytes[70000] = '\0';
  bytes[140000] = '\r';
  std::ofstream(path("f.txt"), std::ios::binary) << bytes;
  EXPECT_EQ(read_input("--flag f", path("f.txt"), "a text file", bytes.size()), bytes);
  std::ofstream(path("empty.txt"));
  EXPECT_EQ(read_input("--flag e", path("empty.txt"), "a text file", 0), "");
}

TEST_F(InputFile, EachBadPathIsOneLineNamingTheFlag) {
  std::ofstream(path("f.txt")) << "12345";
  EXPECT_EQ(error_of(path("missing.txt")), "--flag " + path("missing.txt") + ": no such file");
  EXPECT_EQ(error_of(dir_), "--flag " + dir_ + ": is a directory, not a text file");
  EXPECT_EQ(error_of(path("f.txt/x")), "--flag " + path("f.txt/x") + ": cannot open (Not a directory)");
  EXPECT_EQ(error_of(path("f.txt"), 4), "--flag " + path("f.txt") + ": larger than 4 bytes");
  EXPECT_EQ(error_of(path("f.txt"), 5), "");
  EXPECT_EQ(error_of(""), "--flag : no such file");
}

TEST_F(InputFile, AStreamWithoutASizeIsCountedAsItComes) {
  // /dev/zero reports no size and never ends: the limit must still stop it.
  EXPECT_EQ(error_of("/dev/zero", 100000), "--flag /dev/zero: larger than 100000 bytes");
  EXPECT_EQ(read_input("--flag n", "/dev/null", "a text file", 10), "");
}

TEST_F(InputFile, OpenInputGivesAStreamAtTheStart) {
  std::ofstream(path("f.csv")) << "a,b\n1,2\n";
  std::ifstream in = open_input("--workload f", path("f.csv"), "a CSV file");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "a,b");
  try {
    open_input("--workload d", dir_, "a CSV file");
    ADD_FAILURE() << "a directory opened";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--workload d: is a directory, not a CSV file");
  }
}

}  // namespace
}  // namespace shardlab
