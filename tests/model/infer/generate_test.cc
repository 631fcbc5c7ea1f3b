// generate() on the virtual cluster against the unsharded GPT<float> that
// re-runs the whole sequence for every token (no KV cache): the same tokens
// under every parallel split, greedy and sampled; the cached decode's logits
// equal the full forward's within a stated tolerance; decode time grows with
// the context exactly as the attention kernels' costs (recomputed here) say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "model/kernels.h"
#include "support/compare.h"
#include "tests/model/infer/infer_test_util.h"

namespace shardlab::infer {
namespace {

using model::Token;
using testing::run_generate;
using testing::small_config;

// fp32 sums in another order (the cache, tensor-parallel partial sums) move
// the logits by a few ulps per layer; through 4 blocks this stays below 1e-5
// for logits of size ~5 (printed by the test).
constexpr double kLogitTol = 1e-4;

const std::vector<Token> kPrompt = {3, 17, 42, 99, 5};
constexpr int kNew = 12;

struct Split {
  int tp, pp, ep;
  std::string name() const { return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_ep" + std::to_string(ep); }
};

GenerateOptions options(const model::GPTConfig& c, const model::SafetensorsFile* init, Split s,
                        SamplingOptions sampling = {}) {
  GenerateOptions o;
  o.model = c;
  o.init = init;
  o.prompt = kPrompt;
  o.max_new_tokens = kNew;
  o.sampling = sampling;
  o.tp = s.tp;
  o.pp = s.pp;
  o.ep = s.ep;
  return o;
}

void expect_same_tokens_as_reference(bool moe, const std::vector<Split>& splits) {
  const model::GPTConfig c = small_config(moe);
  model::GPT<float> ref(c, 7);
  testing::perturb(ref);
  const model::SafetensorsFile init = testing::as_checkpoint(ref);
  for (const SamplingOptions& sampling : {SamplingOptions{}, SamplingOptions{0.8, 20, 11}, SamplingOptions{1.2, 0, 13, 0.9}}) {
    const std::vector<Token> want = testing::reference_tokens(ref, kPrompt, kNew, sampling);
    // Not a degenerate run that repeats one token whatever the model does.
    std::vector<Token> distinct = want;
    std::sort(distinct.begin(), distinct.end());
    EXPECT_GE(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 3);
    for (const Split& s : splits) {
      const GenerateResult r = run_generate(options(c, &init, s, sampling));
      EXPECT_EQ(r.tokens, want) << s.name() << " temperature " << sampling.temperature;
    }
  }
}

TEST(Generate, DenseTokensEqualTheUnshardedModelUnderEverySplit) {
  expect_same_tokens_as_reference(false, {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 1}});
}

TEST(Generate, MoeTokensEqualTheUnshardedModelUnderExpertParallelism) {
  expect_same_tokens_as_reference(true, {{1, 1, 1}, {1, 1, 2}, {2, 1, 2}});
}

// Multi-head latent attention: the latent cache and the absorbed attention
// against the unsharded training model's up-projected attention, with and
// without q's latent (split by heads at tp 2 and 4, one head a rank).
TEST(Generate, MlaTokensEqualTheUnshardedModelUnderEverySplit) {
  for (const bool q_latent : {true, false}) {
    const model::GPTConfig c = testing::mla_config(q_latent);
    model::GPT<float> ref(c, 7);
    testing::perturb(ref);
    const model::SafetensorsFile init = testing::as_checkpoint(ref);
    for (const SamplingOptions& sampling : {SamplingOptions{}, SamplingOptions{0.8, 20, 11}}) {
      const std::vector<Token> want = testing::reference_tokens(ref, kPrompt, kNew, sampling);
      std::vector<Token> distinct = want;
      std::sort(distinct.begin(), distinct.end());
      EXPECT_GE(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 3);
      for (const Split& s : std::vector<Split>{{1, 1, 1}, {2, 1, 1}, {4, 1, 1}, {1, 2, 1}, {2, 2, 1}}) {
        const GenerateResult r = run_generate(options(c, &init, s, sampling));
        EXPECT_EQ(r.tokens, want) << s.name() << " q latent " << q_latent << " temperature " << sampling.temperature;
      }
    }
  }
}

TEST(Generate, SampledTokensDifferFromGreedyAndFollowTheSeed) {
  const model::GPTConfig c = small_config(false);
  model::GPT<float> ref(c, 7);
  testing::perturb(ref);
  const model::SafetensorsFile init = testing::as_checkpoint(ref);
  const GenerateResult greedy = run_generate(options(c, &init, {1, 1, 1}));
  const GenerateResult a = run_generate(options(c, &init, {1, 1, 1}, {2.0, 0, 1}));
  const GenerateResult b = run_generate(options(c, &init, {1, 1, 1}, {2.0, 0, 2}));
  EXPECT_NE(a.tokens, greedy.tokens);  // at temperature 2 some draw leaves the argmax
  EXPECT_NE(a.tokens, b.tokens);
  EXPECT_EQ(run_generate(options(c, &init, {2, 1, 1}, {2.0, 0, 1})).tokens, a.tokens);
}

// Every step's logits (prefill, then each decode over the cache) against the
// full forward over the sequence so far.
TEST(Generate, CachedDecodeLogitsEqualAFullForward) {
  for (int kind = 0; kind < 3; ++kind) {  // dense, MoE, MLA
    const bool moe = kind == 1;
    const model::GPTConfig c = kind == 2 ? testing::mla_config() : small_config(moe);
    model::GPT<float> ref(c, 7);
  testing::perturb(ref);
    const model::SafetensorsFile init = testing::as_checkpoint(ref);
    for (const Split& s : std::vector<Split>{{1, 1, 1}, {2, 2, 1}}) {
      GenerateOptions o = options(c, &init, s);
      o.keep_logits = true;
      const GenerateResult r = run_generate(o);
      ASSERT_EQ(r.logits.size(), size_t(kNew));
      std::vector<Token> seq = kPrompt;
      std::vector<float> got, want;  // every step's logits, end to end
      for (int step = 0; step < kNew; ++step) {
        const std::vector<float> full = testing::full_forward_last(ref, seq);
        ASSERT_EQ(r.logits[size_t(step)].size(), full.size());
        got.insert(got.end(), r.logits[size_t(step)].begin(), r.logits[size_t(step)].end());
        want.insert(want.end(), full.begin(), full.end());
        seq.push_back(r.tokens[size_t(step)]);
      }
      const auto close = shardlab::testing::all_close(got, want, kLogitTol);
      std::printf("%s %s: cached vs full logits (up to %.3g), %s\n", kind == 2 ? "mla" : moe ? "moe" : "dense",
                  s.name().c_str(), shardlab::testing::max_abs_finite(want), close.message());
      EXPECT_TRUE(close);
    }
  }
}

// Work of the three attention kernels of one decode step (one new token over
// L keys, NH heads of size HS), written out here from the kernels' contract:
// activations at e bytes, the cached keys and values at kv (e by default).
std::vector<OpCost> decode_attention(double L, double NH, double HS, double e, double kv = 0) {
  if (kv == 0) kv = e;
  return {{2 * NH * L * HS, NH * ((HS + L) * e + L * HS * kv)},
          {5 * NH * L, 2 * NH * L * e},
          {2 * NH * L * HS, NH * ((L + HS) * e + L * HS * kv)}};
}

// Between two decode steps only the attention kernels change (one more key
// each): on one device, step k+1 - step k = layers x the change of their time.
TEST(Generate, DecodeTimeGrowsAsTheAttentionCostsSay) {
  const model::GPTConfig c = small_config(false);
  const GenerateResult r = run_generate(options(c, nullptr, {1, 1, 1}));
  const HardwareProfile profile = load_profile("a100-nvlink");
  const CostModel cost(profile.device, Precision::kFp32);
  ASSERT_EQ(r.decode_steps.size(), size_t(kNew - 1));
  for (size_t k = 0; k + 1 < r.decode_steps.size(); ++k) {
    // decode step k attends over prompt + k + 1 keys
    const double L = double(kPrompt.size() + k + 1);
    Time delta = 0;
    const auto before = decode_attention(L, c.n_head, c.head_size(), 4);
    const auto after = decode_attention(L + 1, c.n_head, c.head_size(), 4);
    for (size_t i = 0; i < before.size(); ++i) delta += cost.duration(after[i]) - cost.duration(before[i]);
    EXPECT_GT(delta, 0);
    EXPECT_EQ(r.decode_steps[k + 1] - r.decode_steps[k], c.n_layer * delta) << "decode step " << k;
  }
}

// MLA's absorbed decode (cached_attention.h), written out here: one new
// token's NH heads over L cached latent rows of Lkv + Dr, read once for the
// heads; the latent context of Lkv a head.
// The cached rows at kv bytes an element (e by default).
std::vector<OpCost> decode_mla_attention(double L, double NH, double Lkv, double Dr, double e, double kv = 0) {
  if (kv == 0) kv = e;
  return {{2 * NH * L * (Lkv + Dr), (NH * (Lkv + Dr) + NH * L) * e + L * (Lkv + Dr) * kv},
          {5 * NH * L, 2 * NH * L * e},
          {2 * NH * L * Lkv, (NH * L + NH * Lkv) * e + L * Lkv * kv}};
}

// The same for MLA at tp 1 and 2 (two heads a rank): the absorbed kernels
// over the latent rows, whose width is not the heads' (16 + 8, where a head
// scores over 24 features too but reads 4 heads' keys and values of 24 and 12).
TEST(Generate, MlaDecodeTimeGrowsAsTheAbsorbedAttentionCostsSay) {
  const model::GPTConfig c = testing::mla_config();
  const HardwareProfile profile = load_profile("a100-nvlink");
  const CostModel cost(profile.device, Precision::kFp32);
  for (const int tp : {1, 2}) {
    const GenerateResult r = run_generate(options(c, nullptr, {tp, 1, 1}));
    ASSERT_EQ(r.decode_steps.size(), size_t(kNew - 1));
    for (size_t k = 0; k + 1 < r.decode_steps.size(); ++k) {
      const double L = double(kPrompt.size() + k + 1);
      const double NH = c.n_head / tp;
      Time delta = 0;
      const auto before = decode_mla_attention(L, NH, c.kv_lora_rank, c.qk_rope_head_dim, 4);
      const auto after = decode_mla_attention(L + 1, NH, c.kv_lora_rank, c.qk_rope_head_dim, 4);
      for (size_t i = 0; i < before.size(); ++i) delta += cost.duration(after[i]) - cost.duration(before[i]);
      EXPECT_GT(delta, 0);
      EXPECT_EQ(r.decode_steps[k + 1] - r.decode_steps[k], c.n_layer * delta) << "tp " << tp << " decode step " << k;
    }
  }
}

// FP8 inference (vLLM's FP8 checkpoints) against BF16 on H100, one device:
// a decode step differs only at the blocks' four linears, each now a
// per-token quantization of its input (read 2 B, write 1 B an element) and
// an FP8 GEMM (operands at 1 B, the FP8 peak); the LM head, the attention
// and the norms stay BF16. So fp8 step - bf16 step = layers x the sum over
// the four of quant + FP8 GEMM - BF16 GEMM, written out here. The weights
// of those linears take 1 B instead of 2 (12·C² a layer, split over tp).
// The tokens are the same: the real math stays fp32 at every precision.
TEST(Generate, Fp8ChargesEachLinearAsAQuantizationAndAnFp8Gemm) {
  const model::GPTConfig c = small_config(false);
  const HardwareProfile profile = load_profile("h100-nvlink");
  const CostModel bf16(profile.device, Precision::kBf16), fp8(profile.device, Precision::kFp8);
  const int64_t C = c.n_embd, F = 4 * c.n_embd;
  struct Linear {
    int64_t in, out;
    bool bias;  // in the GEMM (the row-parallel projections add theirs after the reduction)
  };
  const Linear linears[] = {{C, 3 * C, true}, {C, C, false}, {C, F, true}, {F, C, false}};
  Time delta = 0;  // one token of one sequence: one row
  for (const Linear& l : linears) {
    OpCost gemm = model::linear_forward_cost(1, l.in, l.out, l.bias, 2);
    const Time before = bf16.duration(gemm);
    gemm.fp8 = true;
    delta += fp8.duration(OpCost{2.0 * double(l.in), 3.0 * double(l.in)}) + fp8.duration(gemm) - before;
  }
  EXPECT_GT(delta, 0);  // tiny GEMMs: each quantization's launch costs more than the bytes it saves
  for (const int tp : {1, 2}) {
    const GenerateResult a = run_generate(options(c, nullptr, {tp, 1, 1}), Precision::kBf16, "h100-nvlink");
    const GenerateResult b = run_generate(options(c, nullptr, {tp, 1, 1}), Precision::kFp8, "h100-nvlink");
    EXPECT_EQ(b.tokens, a.tokens) << "tp " << tp;
    ASSERT_EQ(a.decode_steps.size(), b.decode_steps.size());
    if (tp == 1)
      for (size_t k = 0; k < a.decode_steps.size(); ++k)
        EXPECT_EQ(b.decode_steps[k] - a.decode_steps[k], c.n_layer * delta) << "decode step " << k;
    for (int d = 0; d < tp; ++d) {
      const auto param = [&](const GenerateResult& r) {
        return int64_t(r.run.devices[size_t(d)].peak_by_kind[size_t(MemKind::kParam)]);
      };
      EXPECT_EQ(param(a) - param(b), 12 * C * C * c.n_layer / tp) << "tp " << tp << " device " << d;
      EXPECT_EQ(b.kv_bytes[size_t(d)], a.kv_bytes[size_t(d)]);  // the cache stays BF16
    }
  }
}

// An FP8 KV cache (--kv-cache-dtype fp8) in a bf16 run: the cache holds 1 B
// an element (half the bytes, exactly), each new row is written at 1 B (the
// append reads its 2-B row and writes it at 1 B) and the attention kernels
// read the cached rows at 1 B; nothing else changes. So fp8-cache step -
// bf16-cache step = layers x (append + the kernels that read the cache, at
// 1 B - the same at 2 B), written out here, at every context length: K and
// V heads (NH x HS each) for MHA, MLA's latent rows (Lkv + Dr) read by its
// absorbed scores and context.
TEST(Generate, Fp8KvCacheHalvesTheCacheAndItsReads) {
  const HardwareProfile profile = load_profile("a100-nvlink");
  const CostModel cost(profile.device, Precision::kBf16);
  for (const model::GPTConfig& c : {small_config(false), testing::mla_config()}) {
    GenerateOptions o = options(c, nullptr, {1, 1, 1});
    const GenerateResult a = run_generate(o, Precision::kBf16);
    o.kv_fp8 = true;
    const GenerateResult b = run_generate(o, Precision::kBf16);
    EXPECT_EQ(b.tokens, a.tokens);  // the values stay fp32: only time and memory change
    EXPECT_EQ(2 * b.kv_bytes[0], a.kv_bytes[0]);
    ASSERT_EQ(a.decode_steps.size(), b.decode_steps.size());
    const bool mla = c.is_mla();
    const double row = mla ? c.kv_lora_rank + c.qk_rope_head_dim : 2.0 * c.n_embd;  // cached a token and layer
    for (size_t k = 0; k < a.decode_steps.size(); ++k) {
      const double L = double(kPrompt.size() + k + 1);
      Time delta = cost.duration(OpCost{0, row * (2 + 1)}) - cost.duration(OpCost{0, row * (2 + 2)});
      const auto bf16 = mla ? decode_mla_attention(L, c.n_head, c.kv_lora_rank, c.qk_rope_head_dim, 2)
                            : decode_attention(L, c.n_head, c.head_size(), 2);
      const auto fp8 = mla ? decode_mla_attention(L, c.n_head, c.kv_lora_rank, c.qk_rope_head_dim, 2, 1)
                           : decode_attention(L, c.n_head, c.head_size(), 2, 1);
      for (size_t i = 0; i < bf16.size(); ++i) delta += cost.duration(fp8[i]) - cost.duration(bf16[i]);
      EXPECT_LT(delta, 0);
      EXPECT_EQ(b.decode_steps[k] - a.decode_steps[k], c.n_layer * delta) << (mla ? "MLA" : "MHA") << " decode step " << k;
    }
  }
}

TEST(Generate, TimesAreDeterministicAndPhantomTimesMatchTheRealRun) {
  for (const model::GPTConfig& c : {small_config(false), testing::mla_config()})
  for (const Split& s : std::vector<Split>{{1, 1, 1}, {2, 2, 1}}) {
    const GenerateResult a = run_generate(options(c, nullptr, s));
    const GenerateResult b = run_generate(options(c, nullptr, s));
    GenerateOptions po = options(c, nullptr, s);
    po.phantom = true;
    const GenerateResult p = run_generate(po);
    EXPECT_EQ(a.tokens, b.tokens) << s.name();
    EXPECT_EQ(a.ttft, b.ttft) << s.name();
    EXPECT_EQ(a.decode_steps, b.decode_steps) << s.name();
    EXPECT_GT(a.ttft, 0);
    // Shapes only: the same kernels, messages and cache, so the same clock.
    EXPECT_EQ(p.ttft, a.ttft) << s.name();
    EXPECT_EQ(p.decode_steps, a.decode_steps) << s.name();
    EXPECT_EQ(p.kv_bytes, a.kv_bytes) << s.name();
  }
}

TEST(Generate, BadOptionsAreConfigErrors) {
  const model::GPTConfig c = small_config(false);
  GenerateOptions o = options(c, nullptr, {1, 1, 1});
  o.max_new_tokens = c.block_size;  // prompt + new > block size
  EXPECT_THROW(validate(o), ConfigError);
  o = options(c, nullptr, {1, 1, 1});
  o.prompt = {c.vocab_size};
  EXPECT_THROW(validate(o), ConfigError);
  o = options(c, nullptr, {3, 1, 1});  // 3 does not divide the heads
  EXPECT_THROW(validate(o), ConfigError);
  o = options(c, nullptr, {1, 1, 2});  // ep needs experts
  EXPECT_THROW(validate(o), ConfigError);
  o = options(c, nullptr, {1, 1, 1});
  o.prompt.clear();
  EXPECT_THROW(validate(o), ConfigError);
}

}  // namespace
}  // namespace shardlab::infer
