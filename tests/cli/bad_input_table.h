// The table form of the bad-input tests (cli_bad_input_test.cc,
// cli_bad_input_model_test.cc): rows of a command and a substring of its one
// error line, {dir} and {file} naming a scratch directory and a regular file.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cli_util.h"

namespace shardlab::testing {

struct Row {
  const char* args;
  const char* needle;  // a substring of the one-line error
};

inline std::string scratch() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "bad_input_" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    std::ofstream(d + "/file") << "not a directory\n";
    return d;
  }();
  return dir;
}

inline std::string expand(std::string text) {
  for (const auto& [key, value] : {std::pair{std::string("{dir}"), scratch()},
                                   std::pair{std::string("{file}"), scratch() + "/file"}}) {
    for (size_t at; (at = text.find(key)) != std::string::npos;) text.replace(at, key.size(), value);
  }
  return text;
}

inline void run_table(const std::vector<Row>& rows) {
  for (const Row& row : rows) expect_usage_error(expand(row.args), expand(row.needle));
}

}  // namespace shardlab::testing
