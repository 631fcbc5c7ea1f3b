// Config validation, parameter table (nanoGPT names and shapes) and the
// counter-based init: determinism, slices, distributions.
#include "model/params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "model/portable_math.h"
#include "model/rng.h"
#include "runtime/errors.h"

namespace shardlab::model {
namespace {

TEST(Config, PresetsAreValid) {
  for (const std::string& name : preset_names()) EXPECT_NO_THROW(preset(name).validate()) << name;
  const GPTConfig tiny = preset("tiny");
  EXPECT_EQ(tiny.n_layer, 4);
  EXPECT_EQ(tiny.n_head, 4);
  EXPECT_EQ(tiny.n_embd, 128);
  EXPECT_EQ(tiny.block_size, 64);
  EXPECT_EQ(tiny.vocab_size, 512);
  EXPECT_EQ(tiny.batch_size, 8);
  EXPECT_LT(preset("nano").n_embd, tiny.n_embd);
  EXPECT_GT(preset("small").n_embd, tiny.n_embd);
  EXPECT_THROW(preset("huge"), ConfigError);
}

void expect_error(const GPTConfig& c, const std::string& needle) {
  try {
    c.validate();
    ADD_FAILURE() << "expected ConfigError mentioning " << needle;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
}

TEST(Config, ValidateNamesTheField) {
  GPTConfig c = preset("tiny");
  c.n_head = 3;
  expect_error(c, "`n_head` 3 must divide `n_embd` 128");
  c = preset("tiny"), c.n_layer = 0;
  expect_error(c, "`n_layer` must be at least 1 (got 0)");
  c = preset("tiny"), c.vocab_size = 1;
  expect_error(c, "`vocab_size` must be at least 2 (got 1)");
  c = preset("tiny"), c.n_expert = 4, c.top_k = 5;
  expect_error(c, "`GPTConfig::top_k` 5 must be between 1 and `n_expert` 4");
  c = preset("tiny"), c.n_shared_expert = 1;
  expect_error(c, "`n_shared_expert`, `n_moe_ffn` and `moe_first_dense` need routed experts");
  c = preset("tiny"), c.n_expert = 4, c.moe_first_dense = 5;
  expect_error(c, "`moe_first_dense` 5 must be between 0 and `n_layer` 4");
  c = preset("tiny"), c.n_expert = 4, c.n_moe_ffn = -1;
  expect_error(c, "`n_moe_ffn` must be positive");
  c = preset("tiny"), c.n_expert = 4, c.capacity_factor = -1;
  expect_error(c, "`capacity_factor` must be >= 0");
}

TEST(ParamTable, NanoGPTNamesShapesAndCount) {
  GPTConfig c = preset("tiny");
  const ParamTable t(c);
  const int64_t C = 128, V = 512, T = 64, L = 4;
  EXPECT_EQ(t.specs().front().name, "transformer.wte.weight");
  EXPECT_EQ(t.at("transformer.wte.weight").shape, (Shape{V, C}));
  EXPECT_EQ(t.at("transformer.wpe.weight").shape, (Shape{T, C}));
  EXPECT_EQ(t.at("transformer.h.3.attn.c_attn.weight").shape, (Shape{3 * C, C}));
  EXPECT_EQ(t.at("transformer.h.0.attn.c_proj.weight").shape, (Shape{C, C}));
  EXPECT_EQ(t.at("transformer.h.0.mlp.c_fc.weight").shape, (Shape{4 * C, C}));
  EXPECT_EQ(t.at("transformer.h.0.mlp.c_proj.weight").shape, (Shape{C, 4 * C}));
  EXPECT_EQ(t.at("transformer.h.0.mlp.c_proj.bias").shape, (Shape{C}));
  EXPECT_EQ(t.specs().back().name, "transformer.ln_f.bias");
  EXPECT_EQ(t.find("lm_head.weight"), nullptr);  // tied
  // nanoGPT count: 12·L·C² + 13·L·C + (V + T)·C + 2C
  EXPECT_EQ(t.numel(), 12 * L * C * C + 13 * L * C + (V + T) * C + 2 * C);
  EXPECT_TRUE(t.at("transformer.wpe.weight").decay());
  EXPECT_FALSE(t.at("transformer.h.1.ln_2.weight").decay());
  EXPECT_THROW(t.at("transformer.h.9.ln_1.weight"), ConfigError);
}

TEST(ParamTable, CountParamsIsTheTablesNumel) {
  for (int experts : {0, 4}) {
    for (int every : {1, 2, 3}) {
      GPTConfig c = preset("tiny");
      c.n_layer = 5;
      c.n_expert = experts;
      c.top_k = 2;
      c.moe_every = every;
      EXPECT_EQ(count_params(c), double(ParamTable(c).numel())) << experts << " experts, every " << every;
    }
  }
  // GPT-2 small's shape (vocab 50257, seq 1024): 124,439,808 parameters with the tied head.
  GPTConfig g = preset("tiny");
  g.n_layer = 12, g.n_head = 12, g.n_embd = 768, g.block_size = 1024, g.vocab_size = 50257;
  EXPECT_EQ(count_params(g), 124439808.0);
}

TEST(ParamTable, MoELayersHaveRouterAndExperts) {
  GPTConfig c = preset("nano");
  c.n_expert = 3, c.top_k = 2, c.moe_every = 2;
  const ParamTable t(c);
  EXPECT_EQ(t.at("transformer.h.0.mlp.router.weight").shape, (Shape{3, c.n_embd}));
  EXPECT_EQ(t.at("transformer.h.0.mlp.experts.2.c_proj.weight").shape,
            (Shape{c.n_embd, 4 * c.n_embd}));
  EXPECT_EQ(t.find("transformer.h.0.mlp.router.bias"), nullptr);
  EXPECT_EQ(t.find("transformer.h.0.mlp.c_fc.weight"), nullptr);
  EXPECT_NE(t.find("transformer.h.1.mlp.c_fc.weight"), nullptr);  // 1 % 2 != 0: dense
  EXPECT_EQ(t.find("transformer.h.1.mlp.router.weight"), nullptr);
}

TEST(ParamTable, FineGrainedAndSharedExperts) {
  // nano (C 64, F 256) with 8 experts of width 32 and 2 shared experts: one
  // shared MLP of width 2·32 = 64 after the routed ones, not an expert.
  GPTConfig c = preset("nano");
  c.n_expert = 8, c.top_k = 8, c.n_moe_ffn = 32, c.n_shared_expert = 2;
  const ParamTable t(c);
  EXPECT_EQ(t.at("transformer.h.1.mlp.experts.7.c_fc.weight").shape, (Shape{32, 64}));
  EXPECT_EQ(t.at("transformer.h.1.mlp.experts.7.c_proj.weight").shape, (Shape{64, 32}));
  const ParamSpec& fc = t.at("transformer.h.1.mlp.shared_experts.c_fc.weight");
  EXPECT_EQ(fc.shape, (Shape{64, 64}));
  EXPECT_EQ(fc.role, ParamRole::kFcWeight);
  EXPECT_FALSE(fc.is_expert());
  EXPECT_EQ(t.at("transformer.h.1.mlp.shared_experts.c_proj.bias").shape, (Shape{64}));
  // By hand, per block: attention 4·64² + 4·64 + ln 4·64 = 16896; router 8·64 =
  // 512; experts 8·(2·32·64 + 32 + 64) = 33536; shared 2·64·64 + 64 + 64 = 8320.
  // Model: wte 256·64 + wpe 32·64 + ln_f 128 = 18560, plus 2 blocks.
  const double block = 16896 + 512 + 33536 + 8320;
  EXPECT_EQ(count_params(c), 18560 + 2 * block);
  EXPECT_EQ(count_params(c), double(t.numel()));
  // --moe-first-dense 1: block 0 is a dense MLP of width 256 (2·256·64 + 256 + 64).
  c.moe_first_dense = 1;
  const ParamTable first_dense(c);
  EXPECT_NE(first_dense.find("transformer.h.0.mlp.c_fc.weight"), nullptr);
  EXPECT_EQ(first_dense.find("transformer.h.0.mlp.router.weight"), nullptr);
  EXPECT_NE(first_dense.find("transformer.h.1.mlp.router.weight"), nullptr);
  EXPECT_EQ(count_params(c), 18560 + (16896 + 33088) + block);
  EXPECT_EQ(count_params(c), double(first_dense.numel()));
}

TEST(Init, DeterministicAndSeedDependent) {
  const ParamTable t(preset("nano"));
  std::vector<float> a(t.numel()), b(t.numel()), c(t.numel());
  t.init_all(42, a.data());
  t.init_all(42, b.data());
  t.init_all(43, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Different tensors of the same shape draw different values.
  const auto& w1 = t.at("transformer.h.0.attn.c_proj.weight");
  const auto& w2 = t.at("transformer.h.1.attn.c_proj.weight");
  EXPECT_NE(a[w1.offset], a[w2.offset]);
}

TEST(Init, SliceEqualsTheSameRangeOfTheFullTensor) {
  const ParamTable t(preset("nano"));
  std::vector<double> full(t.numel());
  t.init_all(7, full.data());
  int64_t mismatches = 0;
  for (const ParamSpec& spec : t.specs()) {
    for (int64_t off : {int64_t{0}, spec.numel / 3, spec.numel - 1}) {
      const int64_t count = std::min<int64_t>(spec.numel - off, 97);
      std::vector<double> part(count);
      t.init_slice(spec.name, 7, off, count, part.data());
      for (int64_t i = 0; i < count; ++i) mismatches += part[i] != full[spec.offset + off + i];
    }
  }
  std::printf("[init] slices vs full init: %lld mismatching elements (tol 0, bit-exact)\n",
              static_cast<long long>(mismatches));
  EXPECT_EQ(mismatches, 0);
  double x;
  EXPECT_THROW(t.init_slice("transformer.ln_f.bias", 7, 64, 1, &x), ConfigError);
}

TEST(Init, DistributionsFollowNanoGPT) {
  const GPTConfig c = preset("tiny");
  const ParamTable t(c);
  std::vector<double> p(t.numel());
  t.init_all(1, p.data());
  auto stats = [&](const std::string& name) {
    const ParamSpec& s = t.at(name);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < s.numel; ++i)
      sum += p[s.offset + i], sq += p[s.offset + i] * p[s.offset + i];
    const double mean = sum / s.numel;
    return std::pair{mean, std::sqrt(sq / s.numel - mean * mean)};
  };
  const auto [m_wte, s_wte] = stats("transformer.wte.weight");
  const auto [m_fc, s_fc] = stats("transformer.h.2.mlp.c_fc.weight");
  const auto [m_pr, s_pr] = stats("transformer.h.2.mlp.c_proj.weight");
  const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  std::printf("[init] wte mean %.2e std %.5f; c_fc std %.5f; c_proj std %.5f (want %.5f)\n", m_wte,
              s_wte, s_fc, s_pr, proj_std);
  EXPECT_NEAR(m_wte, 0, 1e-3);
  EXPECT_NEAR(s_wte, 0.02, 0.02 * 0.02);
  EXPECT_NEAR(s_fc, 0.02, 0.02 * 0.02);
  EXPECT_NEAR(s_pr, proj_std, proj_std * 0.02);
  EXPECT_EQ(stats("transformer.h.0.ln_1.weight"), (std::pair{1.0, 0.0}));
  EXPECT_EQ(stats("transformer.h.0.attn.c_attn.bias"), (std::pair{0.0, 0.0}));
}

TEST(Rng, UniformNeverZeroAndNormalIsStandard) {
  const uint64_t key = stream_key(5, "x");
  double sum = 0, sq = 0, mn = 1;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    mn = std::min(mn, uniform_at(key, i));
    const double z = normal_at(key, i);
    sum += z, sq += z * z;
  }
  EXPECT_GT(mn, 0.0);
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
  EXPECT_NE(stream_key(5, "x"), stream_key(6, "x"));
  EXPECT_NE(stream_key(5, "x"), stream_key(5, "y"));
}

uint64_t bits_of(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

// The vectorised init (normals_at) gives normal_at's bits: every element of
// long runs at odd and even starts under three keys.
TEST(Rng, NormalsAtAreNormalAtBitForBit) {
  int64_t differ = 0, checked = 0;
  for (const uint64_t key : {stream_key(1337, "transformer.wte.weight"), stream_key(5, "x"), uint64_t{0}})
    for (const uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{999983}}) {
      std::vector<double> z(100003);
      normals_at(key, first, int64_t(z.size()), z.data());
      for (size_t i = 0; i < z.size(); ++i, ++checked)
        differ += bits_of(z[i]) != bits_of(normal_at(key, first + i)) ? 1 : 0;
    }
  std::printf("normals_at: %lld of %lld values differ from normal_at (tolerance 0 bits)\n", (long long)differ,
              (long long)checked);
  EXPECT_EQ(differ, 0);
}

// detail::normal_of at the edges of its shortcuts against pm::log and
// pm::cos_2pi on the same uniforms: u = 2^-53 and 1, round(4u) at and
// around every half (where it changes quadrant), u's mantissa around √½
// (where log moves it), exactly 1/4, 1/2, 3/4.
TEST(Rng, NormalOfMatchesLogAndCosAtTheirEdges) {
  const uint64_t one = uint64_t{1} << 53;
  std::vector<uint64_t> js = {1, 2, 3, 4, one - 2, one - 1, one, one / 2, one / 4, 3 * (one / 4)};
  for (uint64_t k = 0; k < 8; ++k)
    for (int64_t d = -2; d <= 2; ++d) js.push_back(uint64_t(int64_t(k * (uint64_t{1} << 50)) + d) + (k ? 0 : 3));
  for (int e = 0; e < 52; e += 5) {  // m near √½ at several exponents
    const uint64_t at = uint64_t(0.70710678118654752 * double(uint64_t{1} << (53 - e)));
    for (int64_t d = -2; d <= 2; ++d) js.push_back(uint64_t(int64_t(at) + d));
  }
  const auto word = [](uint64_t j) { return ((j - 1) << 11) | 0x5a5; };  // (r >> 11) + 1 == j
  int differ = 0;
  for (uint64_t j1 : js)
    for (uint64_t j2 : js) {
      const double u1 = double(j1) * 0x1.0p-53, u2 = double(j2) * 0x1.0p-53;
      const double want = std::sqrt(-2.0 * pm::log(u1)) * pm::cos_2pi(u2);
      const double got = detail::normal_of(word(j1), word(j2));
      if (bits_of(got) != bits_of(want)) {
        if (++differ < 5) ADD_FAILURE() << "j1 " << j1 << " j2 " << j2 << ": " << got << " vs " << want;
      }
    }
  std::printf("normal_of: %d of %zu edge pairs differ (tolerance 0 bits)\n", differ, js.size() * js.size());
  EXPECT_EQ(differ, 0);
}

}  // namespace
}  // namespace shardlab::model
