// Runs the shardlab binary and captures stdout, stderr and the exit code.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace shardlab::testing {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline CliResult run_cli(const std::string& args) {
  static int counter = 0;
  const std::string base = ::testing::TempDir() + "cli_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  const std::string cmd = std::string(SHARDLAB_BIN) + " " + args + " >" + base + ".out 2>" + base + ".err";
  int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Bad input: exit code 2 and exactly one line on stderr containing `needle`.
inline void expect_usage_error(const std::string& args, const std::string& needle) {
  CliResult r = run_cli(args);
  EXPECT_EQ(r.code, 2) << args << "\nstderr: " << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << args << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\nstderr: " << r.err;
}

}  // namespace shardlab::testing
