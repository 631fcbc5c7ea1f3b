// What the serve command's tests share: a counting model, saved once, and
// token lists as --prompt-tokens takes them.
#pragma once

#include <unistd.h>

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab::testing {

// A nano model trained to count, saved once.
inline std::string counting_checkpoint() {
  static const std::string path = [] {
    const std::string p = ::testing::TempDir() + "serve_counting_" + std::to_string(getpid()) + ".safetensors";
    const CliResult r = run_cli("train --model nano --data synthetic:counting --steps 60 --lr 3e-3 --json --save " + p);
    EXPECT_EQ(r.code, 0) << r.err;
    return p;
  }();
  return path;
}

inline std::string joined(const nlohmann::json& tokens) {
  std::string out;
  for (const auto& t : tokens) out += (out.empty() ? "" : ",") + std::to_string(t.get<int>());
  return out;
}

}  // namespace shardlab::testing
