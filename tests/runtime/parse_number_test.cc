// The one number rule (runtime/parse_number.h): the whole text in
// from_chars's grammar, no '+', no space, no hex, reals finite.
#include "runtime/parse_number.h"

#include <cstdint>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace shardlab {
namespace {

TEST(ParseNumber, TakesPlainDecimals) {
  EXPECT_EQ(parse_number<int>("5"), 5);
  EXPECT_EQ(parse_number<int>("-3"), -3);
  EXPECT_EQ(parse_number<int>("0"), 0);
  EXPECT_EQ(parse_number<int>("2147483647"), 2147483647);  // INT32_MAX
  EXPECT_EQ(parse_number<uint64_t>("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_number<double>("0.25"), 0.25);  // exact in binary
  EXPECT_EQ(parse_number<double>(".5"), 0.5);
  EXPECT_EQ(parse_number<double>("1e-3"), 0.001);  // the nearest double, as the literal
  EXPECT_EQ(parse_number<double>("-2E2"), -200.0);
  EXPECT_EQ(parse_number<float>("1.5"), 1.5f);
}

TEST(ParseNumber, RefusesWhatStodAndStoiTook) {
  // std::stoi/stod take these (a sign, leading space, a prefix of the text).
  for (const char* bad : {"+5", " 5", "5 ", "\t5", "5abc", "5,", "0x10", "1_000", "", " ", "-", "+", "--5"})
    EXPECT_EQ(parse_number<int>(bad), std::nullopt) << "\"" << bad << "\"";
  for (const char* bad : {"+0.5", " 0.5", "0.5 ", "0x1p3", "1e", "e5", ".", "1..2", "1e5x"})
    EXPECT_EQ(parse_number<double>(bad), std::nullopt) << "\"" << bad << "\"";
}

TEST(ParseNumber, RefusesOutOfRangeAndNonFinite) {
  EXPECT_EQ(parse_number<int>("2147483648"), std::nullopt);  // INT32_MAX + 1
  EXPECT_EQ(parse_number<int>("2.0"), std::nullopt);         // an integer has no fraction
  EXPECT_EQ(parse_number<uint64_t>("-1"), std::nullopt);
  EXPECT_EQ(parse_number<double>("1e400"), std::nullopt);  // beyond DBL_MAX ~1.8e308
  for (const char* bad : {"inf", "-inf", "nan", "infinity"}) {
    EXPECT_EQ(parse_number<double>(bad), std::nullopt) << bad;
    // parse_whole takes them, for callers that name them in their own words.
    EXPECT_TRUE(parse_whole<double>(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace shardlab
