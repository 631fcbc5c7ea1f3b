// Helpers shared by the model I/O tests: scratch files and error matching.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "runtime/errors.h"

namespace shardlab::model::testing {

// A fresh directory per test, removed at the end.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("shardlab_model_io_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Runs fn, expects a ConfigError whose one-line message contains every word.
inline void expect_config_error(const std::function<void()>& fn,
                                const std::vector<std::string>& words) {
  try {
    fn();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    for (const std::string& w : words)
      EXPECT_NE(msg.find(w), std::string::npos) << "message lacks \"" << w << "\": " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ConfigError, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected ConfigError, nothing thrown";
}

}  // namespace shardlab::model::testing
