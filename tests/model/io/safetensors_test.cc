// safetensors: bit-exact round trip, a hand-built file, and every kind of
// corrupt file giving one clear ConfigError line.
#include "model/io/safetensors.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/io/token_rng.h"
#include "tests/model/io/test_util.h"

namespace shardlab::model {
namespace {

using testing::expect_config_error;
using testing::ScratchDir;
using testing::write_bytes;

// The bytes of a file put together by hand: u64 length (little-endian, byte by
// byte), the header text as given, the data bytes as given.
std::string hand_file(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string f32_le(std::initializer_list<uint32_t> bits) {
  std::string out;
  for (uint32_t b : bits)
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((b >> (8 * i)) & 0xff));
  return out;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = std::bit_cast<float>(static_cast<uint32_t>(rng.next()));  // any bits
  return v;
}

TEST(Safetensors, RoundTripIsBitExact) {
  ScratchDir dir;
  std::vector<float> w = random_floats(15, 1), b = random_floats(7, 2), s = {-0.0f}, e;
  w[0] = std::numeric_limits<float>::infinity();
  w[1] = std::numeric_limits<float>::denorm_min();
  w[2] = std::bit_cast<float>(0x7fc01234u);  // NaN with a payload
  std::vector<NamedTensorView> views = {{"transformer.wte.weight", {3, 5}, w.data()},
                                        {"b.bias", {7}, b.data()},
                                        {"scalar", {}, s.data()},
                                        {"empty", {0, 4}, e.data()}};
  std::map<std::string, std::string> meta = {{kShardlabConfigKey, R"({"n_layer":4})"},
                                             {"format", "pt"}};
  const std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, views, meta);
  SafetensorsFile f = load_safetensors(path);

  EXPECT_EQ(f.names(),
            (std::vector<std::string>{"b.bias", "empty", "scalar", "transformer.wte.weight"}));
  EXPECT_EQ(f.metadata(), meta);
  for (const NamedTensorView& v : views) {
    std::span<const float> got = f.get(v.name, v.shape);
    ASSERT_EQ(got.size(), static_cast<size_t>(shape_numel(v.shape))) << v.name;
    for (size_t i = 0; i < got.size(); ++i)  // compare bits: NaN payloads and -0 included
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(v.data[i]))
          << v.name << " differs at " << i;
  }
  // Writing what was read gives the same bytes: nothing is lost or reordered.
  std::vector<NamedTensorView> again;
  for (const std::string& n : f.names()) again.push_back({n, f.at(n).shape, f.at(n).data.data()});
  EXPECT_EQ(safetensors_bytes(again, f.metadata()), safetensors_bytes(views, meta));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Safetensors, WriterFollowsThePythonLayout) {
  std::vector<float> a = {1, 2}, z = {3};
  std::string bytes =
      safetensors_bytes({{"z", {1}, z.data()}, {"a", {2}, a.data()}}, {{"format", "pt"}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[size_t(i)]);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  ASSERT_EQ(bytes.size(), 8 + n + 12);
  auto header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  std::vector<std::string> keys;
  for (const auto& [k, v] : header.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "a", "z"}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::parse("[0, 8]"));
  EXPECT_EQ(header["z"]["data_offsets"], nlohmann::json::parse("[8, 12]"));
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(bytes.substr(8 + n), f32_le({0x3f800000, 0x40000000, 0x40400000}));  // 1, 2, 3
}

TEST(Safetensors, HandBuiltFileLoads) {
  ScratchDir dir;
  // Tensors deliberately not in name order in the data section, padded header.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"( "a":{"shape":[1,2],"dtype":"F32","data_offsets":[8,16]}}    )";
  // b = [1.0, -2.0], a = [[0.5, 3.0]]
  const std::string data = f32_le({0x3f800000, 0xc0000000, 0x3f000000, 0x40400000});
  write_bytes(dir.file("hand.safetensors"), hand_file(header, data));
  SafetensorsFile f = load_safetensors(dir.file("hand.safetensors"));
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  std::span<const float> b = f.get("b", {2}), a = f.get("a", {1, 2});
  EXPECT_EQ(std::vector<float>(b.begin(), b.end()), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(std::vector<float>(a.begin(), a.end()), (std::vector<float>{0.5f, 3.0f}));
}

TEST(Safetensors, LookupNamesTheTensor) {
  std::vector<float> w(6, 1.0f);
  auto bytes = safetensors_bytes({{"transformer.h.0.ln_1.weight", {6}, w.data()}});
  SafetensorsFile f = parse_safetensors(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "x.safetensors");
  expect_config_error([&] { f.at("transformer.h.1.ln_1.weight"); },
                      {"x.safetensors", "missing tensor", "transformer.h.1.ln_1.weight"});
  expect_config_error(
      [&] {
        f.get("transformer.h.0.ln_1.weight", {3, 2});
      },
      {"transformer.h.0.ln_1.weight", "[6]", "[3, 2]"});
}

TEST(Safetensors, WriterRejectsBadInput) {
  ScratchDir dir;
  float x = 0;
  expect_config_error(
      [&] {
        safetensors_bytes({{"a", {1}, &x}, {"a", {1}, &x}});
      },
      {"duplicate", "\"a\""});
  expect_config_error([&] { safetensors_bytes({{"a", {-1}, &x}}); }, {"negative", "\"a\""});
  expect_config_error([&] { safetensors_bytes({{"__metadata__", {1}, &x}}); }, {"invalid"});
  expect_config_error([&] { save_safetensors(dir.file("no/such/dir/x.safetensors"), {}); },
                      {"cannot write"});
}

struct CorruptCase {
  const char* what;
  std::string bytes;
  std::vector<std::string> words;
};

std::vector<CorruptCase> corrupt_cases() {
  const std::string d8 = std::string(8, '\0'), d12 = std::string(12, '\0');
  auto one = [](const std::string& dtype, const std::string& shape, const std::string& off) {
    return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + off +
           "}}";
  };
  std::string huge_len = hand_file("{}", "");
  for (int i = 0; i < 8; ++i) huge_len[size_t(i)] = '\xff';
  return {
      {"empty file", "", {"truncated", "8-byte"}},
      {"five bytes", "abcde", {"truncated", "5 bytes"}},
      {"header beyond file", hand_file("{}", "").substr(0, 9), {"truncated", "header length 2"}},
      {"absurd header length", huge_len, {"truncated", "header length"}},
      {"bad JSON", hand_file(R"({"w": {"dtype": "F32",)", ""), {"not valid JSON"}},
      {"header is an array", hand_file("[1, 2]", ""), {"not a JSON object", "array"}},
      {"data shorter than offsets",
       hand_file(one("F32", "[3]", "[0,12]"), d8),
       {"\"w\"", "run past the data section", "truncated"}},
      {"offsets reversed", hand_file(one("F32", "[0]", "[8,0]"), d8), {"end before they begin"}},
      {"offsets not matching shape",
       hand_file(one("F32", "[3]", "[0,8]"), d8),
       {"\"w\"", "hold 8 bytes", "[3]", "needs 12"}},
      {"overlap",
       hand_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 d12),
       {"overlap", "\"a\"", "\"b\""}},
      {"gap", hand_file(one("F32", "[2]", "[4,12]"), d12), {"belong to no tensor", "[0, 4)"}},
      {"trailing bytes", hand_file(one("F32", "[2]", "[0,8]"), d12), {"4 bytes after the last"}},
      {"F16", hand_file(one("F16", "[4]", "[0,8]"), d8), {"\"w\"", "F16", "unsupported"}},
      {"BF16", hand_file(one("BF16", "[4]", "[0,8]"), d8), {"BF16", "unsupported"}},
      {"dtype not a string",
       hand_file(R"({"w":{"dtype":1,"shape":[2],"data_offsets":[0,8]}})", d8),
       {"dtype is not a string"}},
      {"negative shape", hand_file(one("F32", "[-2]", "[0,8]"), d8), {"negative", "-2"}},
      {"absurd shape",
       hand_file(one("F32", "[4000000000000000000,4000000000000000000]", "[0,8]"), d8),
       {"absurdly large", "hold 8 bytes"}},
      {"fractional shape", hand_file(one("F32", "[2.5]", "[0,8]"), d8), {"not an integer"}},
      {"offset beyond int64",
       hand_file(one("F32", "[2]", "[0,18446744073709551615]"), d8),
       {"out of range"}},
      {"missing fields", hand_file(R"({"w":{"dtype":"F32"}})", ""), {"\"w\"", "needs"}},
      {"metadata not strings",
       hand_file(R"({"__metadata__":{"step":3}})", ""),
       {"__metadata__", "step", "not a string"}},
      {"deeply nested",
       hand_file(std::string(100000, '[') + std::string(100000, ']'), ""),
       {"not a JSON object"}},
  };
}

TEST(Safetensors, EachCorruptFileGivesItsClearError) {
  ScratchDir dir;
  for (const CorruptCase& c : corrupt_cases()) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    std::vector<std::string> words = c.words;
    words.push_back(path);
    expect_config_error([&] { load_safetensors(path); }, words);
  }
  expect_config_error([&] { load_safetensors(dir.file("absent.safetensors")); },
                      {"absent.safetensors", "no such file"});
  expect_config_error([&] { load_safetensors(dir.file("")); }, {"directory"});
}

// Every prefix of a valid file and every single-byte corruption of its header
// either loads or throws ConfigError: never a crash (run this under ASan).
TEST(Safetensors, TruncationsAndByteFlipsNeverCrash) {
  std::vector<float> a = random_floats(6, 3), b = random_floats(4, 4);
  const std::string good =
      safetensors_bytes({{"a", {2, 3}, a.data()}, {"b", {4}, b.data()}}, {{"k", "v"}});
  auto parse = [](const std::string& s) {
    return parse_safetensors({reinterpret_cast<const uint8_t*>(s.data()), s.size()}, "fuzz");
  };
  int errors = 0, loads = 0;
  for (size_t len = 0; len < good.size(); ++len) {
    EXPECT_THROW(parse(good.substr(0, len)), ConfigError) << "prefix of " << len << " bytes";
  }
  SplitMix64 rng(5);
  const size_t header_end = 8 + 128 < good.size() ? 8 + 128 : good.size();
  for (size_t pos = 0; pos < header_end; ++pos) {
    for (int trial = 0; trial < 8; ++trial) {
      std::string bad = good;
      bad[pos] = static_cast<char>(rng.uniform(256));
      try {
        parse(bad);
        ++loads;
      } catch (const ConfigError&) {
        ++errors;
      }
    }
  }
  std::printf("byte flips: %d loaded, %d clear errors\n", loads, errors);
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace shardlab::model
