// Token data: nanoGPT .bin files, the --data dispatcher, --sampling parsing.
#include "model/io/data.h"

#include <gtest/gtest.h>

#include "model/io/synthetic.h"
#include "tests/model/io/test_util.h"

namespace shardlab::model {
namespace {

using testing::expect_config_error;
using testing::ScratchDir;
using testing::write_bytes;

// uint16 little-endian, byte by byte, whatever the host.
std::string u16_le(const std::vector<uint32_t>& tokens) {
  std::string out;
  for (uint32_t t : tokens) {
    out.push_back(static_cast<char>(t & 0xff));
    out.push_back(static_cast<char>((t >> 8) & 0xff));
  }
  return out;
}

TEST(TokenBin, LoadsLittleEndianTokens) {
  ScratchDir dir;
  const std::vector<uint32_t> tokens = {0, 1, 255, 256, 511, 258, 7, 300, 42, 0x1ff};
  write_bytes(dir.file("train.bin"), u16_le(tokens));
  TokenData d = load_token_bin(dir.file("train.bin"), 512, 4);
  EXPECT_EQ(d.origin, dir.file("train.bin"));
  EXPECT_EQ(d.vocab, 512);
  EXPECT_FALSE(d.best_loss.has_value());
  ASSERT_EQ(d.tokens.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(d.tokens[i], tokens[i]) << "at " << i;
  // The full uint16 range is accepted when the vocab allows it.
  write_bytes(dir.file("wide.bin"), u16_le({65535, 0, 50256}));
  EXPECT_EQ(load_token_bin(dir.file("wide.bin"), 65536, 2).tokens[0], 65535);
}

TEST(TokenBin, TokenAtOrAboveVocabNamesFirstPositionAndValue) {
  ScratchDir dir;
  write_bytes(dir.file("bad.bin"), u16_le({1, 2, 3, 512, 4, 9000, 5}));
  expect_config_error([&] { load_token_bin(dir.file("bad.bin"), 512, 2); },
                      {"bad.bin", "token 512", "position 3", "vocab 512"});
  expect_config_error([&] { load_token_bin(dir.file("bad.bin"), 600, 2); },
                      {"token 9000", "position 5", "vocab 600"});
  EXPECT_NO_THROW(load_token_bin(dir.file("bad.bin"), 9001, 2));
}

TEST(TokenBin, BadFilesGiveClearErrors) {
  ScratchDir dir;
  write_bytes(dir.file("odd.bin"), u16_le({1, 2, 3}) + "x");
  expect_config_error([&] { load_token_bin(dir.file("odd.bin"), 512, 1); },
                      {"odd.bin", "odd length", "7 bytes"});
  write_bytes(dir.file("short.bin"), u16_le({1, 2, 3, 4, 5, 6, 7, 8}));
  expect_config_error([&] { load_token_bin(dir.file("short.bin"), 512, 8); },
                      {"short.bin", "8 tokens", "too short", "seq+1 = 9"});
  EXPECT_EQ(load_token_bin(dir.file("short.bin"), 512, 7).tokens.size(), 8u);  // exactly one window
  write_bytes(dir.file("empty.bin"), "");
  expect_config_error([&] { load_token_bin(dir.file("empty.bin"), 512, 1); }, {"0 tokens"});
  expect_config_error([&] { load_token_bin(dir.file("missing.bin"), 512, 8); },
                      {"`data`", "missing.bin", "no such file"});
  expect_config_error([&] { load_token_bin(dir.file(""), 512, 8); }, {"directory"});
  expect_config_error([&] { load_token_bin(dir.file("short.bin"), 0, 8); }, {"`vocab_size` must be positive (got 0)"});
}

TEST(TokenData, DispatchesOnTheSpec) {
  ScratchDir dir;
  write_bytes(dir.file("t.bin"), u16_le({1, 2, 3, 4, 5}));
  EXPECT_EQ(open_token_data(dir.file("t.bin"), 16, 4, 0).tokens.size(), 5u);
  TokenData m = open_token_data("synthetic:markov", 512, 64, 7, 10000);
  EXPECT_EQ(m.origin, "synthetic:markov");
  EXPECT_EQ(m.tokens.size(), 10000u);
  ASSERT_TRUE(m.best_loss.has_value());
  EXPECT_EQ(*m.best_loss, *find_synthetic_task("markov").best_loss(512));
  EXPECT_FALSE(open_token_data("synthetic:copy", 512, 64, 7, 1000).best_loss.has_value());
  expect_config_error([&] { open_token_data("synthetic:shakespeare", 512, 64, 7); },
                      {"unknown synthetic task", "shakespeare", "synthetic:markov",
                       "synthetic:counting", "synthetic:copy", "synthetic:reverse"});
  expect_config_error([&] { open_token_data("synthetic:markov", 4, 64, 7); },
                      {"`vocab_size` 4", "synthetic:markov"});
  expect_config_error([&] { open_token_data("synthetic:markov", 70000, 64, 7); }, {"65536"});
  expect_config_error([&] { open_token_data("synthetic:markov", 512, 64, 7, 64); },
                      {"synthetic:markov", "too short"});
}

TEST(Sampling, ParsesFlag) {
  EXPECT_EQ(parse_sampling("random"), Sampling::kRandom);
  EXPECT_EQ(parse_sampling("sequential"), Sampling::kSequential);
  EXPECT_STREQ(sampling_name(Sampling::kSequential), "sequential");
  expect_config_error([] { parse_sampling("shuffled"); }, {"`sampling`", "shuffled", "random"});
}

}  // namespace
}  // namespace shardlab::model
