// examples/custom_collective: the recursive-doubling all-reduce and the
// library's ring pass the example's own checks (exact sums, times equal to
// their closed forms to the picosecond) on the built-in profiles, the times
// are the ones a hand calculation gives, and bad input is one line with exit
// code 2.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

struct Row {
  double rd = -1, rd_closed = -1, ring = -1, ring_closed = -1;  // us
};

// The table row for a buffer of `bytes`; all -1 if there is none.
Row row(const std::string& out, const std::string& bytes) {
  const size_t at = out.find("\n" + std::string(10 - bytes.size(), ' ') + bytes + " ");
  Row r;
  if (at != std::string::npos)
    std::sscanf(out.c_str() + at + 11, "%lf %lf %lf %lf", &r.rd, &r.rd_closed, &r.ring,
                &r.ring_closed);
  return r;
}

TEST(CustomCollective, PassesOnEveryBuiltinProfile) {
  for (const char* profile : {"a100-nvlink", "a100-pcie", "h100-nvlink"}) {
    const auto r = run_cli(profile);
    EXPECT_EQ(r.code, 0) << profile << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("\nPASS: "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("MISMATCH"), std::string::npos) << r.out;
  }
}

// By hand, 8 A100s on NVLink, α = 2 us, packets of 128 B with 32 B of header:
//   recursive doubling, 3 steps of the whole buffer:
//     4 KiB: 32 packets, W = 5120 B, w = 0.017067 us (rounded up to the ps)
//     4 MiB: 32768 packets, W = 5242880 B, w = 17.476267 us
//   ring on plain sends, the 4 us launch (collective_launch_us: the kernel
//   launch alone, the profile's protocols adding their own starts) + 14 steps of an eighth:
//     512 B: 4 packets, W = 640 B, w = 0.002134 us
TEST(CustomCollective, TimesAreTheHandComputedOnes) {
  const auto r = run_cli("");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("on 8 devices of a100-nvlink"), std::string::npos) << r.out;
  const Row small = row(r.out, "4096"), large = row(r.out, "4194304");
  EXPECT_DOUBLE_EQ(small.rd, 3 * (2 + 0.017067)) << r.out;
  EXPECT_DOUBLE_EQ(large.rd, 3 * (2 + 17.476267)) << r.out;
  EXPECT_DOUBLE_EQ(small.ring, 4 + 14 * (2 + 0.002134)) << r.out;
  EXPECT_DOUBLE_EQ(small.rd_closed, small.rd) << r.out;
  EXPECT_DOUBLE_EQ(small.ring_closed, small.ring) << r.out;
}

TEST(CustomCollective, HelpIsTheUsageAndExitZero) {
  const auto r = run_cli("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("usage: custom_collective [PROFILE]"), std::string::npos) << r.out;
}

TEST(CustomCollective, BadInputIsOneLineAndExitTwo) {
  expect_usage_error("no-such-profile", "no-such-profile");
  expect_usage_error("a100-nvlink extra", "usage: custom_collective [PROFILE]");
}

}  // namespace
}  // namespace shardlab
