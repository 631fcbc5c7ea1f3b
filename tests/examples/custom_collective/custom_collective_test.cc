// examples/custom_collective: the recursive-doubling all-reduce passes its own
// checks (exact sums, log2(n)(α + w(S)) to the picosecond) on the built-in
// profiles, its times are the ones a hand calculation gives, and bad input is
// one line with exit code 2.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "tests/examples/shardlab/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

// The recursive-doubling virtual time (us) of the row for `bytes`; -1 if none.
double rd_us(const std::string& out, const std::string& bytes) {
  const size_t at = out.find("\n" + std::string(10 - bytes.size(), ' ') + bytes + " ");
  double t = -1;
  if (at != std::string::npos) std::sscanf(out.c_str() + at + 12, "%lf", &t);
  return t;
}

TEST(CustomCollective, PassesOnEveryBuiltinProfile) {
  for (const char* profile : {"a100-nvlink", "a100-pcie", "h100-nvlink"}) {
    const auto r = run_cli(profile);
    EXPECT_EQ(r.code, 0) << profile << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("\nPASS: "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("MISMATCH"), std::string::npos) << r.out;
  }
}

// By hand, 8 A100s on NVLink, 3 steps of the whole buffer, α = 2 us:
//   4 KiB:   32 packets of 128 B + 32 B  -> W = 5120 B,    w = 0.017067 us (rounded up)
//   4 MiB:   32768 packets              -> W = 5242880 B, w = 17.476267 us
TEST(CustomCollective, TimesAreTheHandComputedOnes) {
  const auto r = run_cli("");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("on 8 devices of a100-nvlink"), std::string::npos) << r.out;
  EXPECT_DOUBLE_EQ(rd_us(r.out, "4096"), 3 * (2 + 0.017067)) << r.out;
  EXPECT_DOUBLE_EQ(rd_us(r.out, "4194304"), 3 * (2 + 17.476267)) << r.out;
}

TEST(CustomCollective, BadInputIsOneLineAndExitTwo) {
  expect_usage_error("no-such-profile", "no-such-profile");
  expect_usage_error("a100-nvlink extra", "usage: custom_collective [PROFILE]");
}

}  // namespace
}  // namespace shardlab
