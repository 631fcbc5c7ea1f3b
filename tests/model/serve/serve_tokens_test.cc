// Serving on the model's values: under continuous batching (several
// requests at once, arrivals while others decode, chunked prefill, a cache
// small enough to preempt and recompute) every request's tokens equal those
// `generate` produces for its prompt alone, greedy or sampled (request i
// with generate's seed S + i), unsharded and under tp 2, pp 2 and, for an
// MoE model, ep 2; the llama family also under tp 4 (K/V replicated), and
// multi-head latent attention's latent cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "model/serve/cluster_step.h"
#include "model/serve/serving.h"
#include "tests/model/infer/infer_test_util.h"
#include "tests/model/serve/serve_values.h"

namespace shardlab::serve {
namespace {

using model::Token;

// Forwards to the cluster executor and counts what the scheduler asked: the
// test must see chunks that sample nothing.
struct Recording final : StepExecutor {
  explicit Recording(ClusterStepExecutor& ex) : ex(ex) {}
  StepOutcome run_step(std::span<const BatchEntry> batch) override {
    for (const BatchEntry& e : batch) {
      chunks_without_token += e.samples ? 0 : 1;
      tokens_fed += int64_t(e.tokens.size());
      new_tokens += e.new_tokens - e.draft;
      drafts += e.draft;
    }
    StepOutcome o = ex.run_step(batch);
    size_t k = 0;
    for (const BatchEntry& e : batch)
      if (e.samples && !o.counts.empty()) accepted += o.counts[k++] - 1;
    return o;
  }
  void begin_step(int replica, double now_s) override { ex.begin_step(replica, now_s); }
  void release(int seq) override { ex.release(seq); }
  void cache_block(int seq, int64_t first, int tokens, int32_t block) override {
    ex.cache_block(seq, first, tokens, block);
  }
  void evict_block(int32_t block) override {
    ++evictions;
    ex.evict_block(block);
  }
  ClusterStepExecutor& ex;
  int evictions = 0;
  int chunks_without_token = 0;
  int64_t tokens_fed = 0, new_tokens = 0;
  int64_t drafts = 0, accepted = 0;
};

struct Split {
  int tp = 1, pp = 1, ep = 1;
  std::string name() const { return fmt::format("tp {} pp {} ep {}", tp, pp, ep); }
};

struct Served {
  ReplicaResult result;
  int chunks_without_token = 0;
  int64_t tokens_fed = 0, new_tokens = 0;
  int evictions = 0;
  int64_t drafts = 0, accepted = 0;
};

Served serve_on_values(const model::GPTConfig& c, const model::SafetensorsFile& init, Split s,
                       const SchedulerOptions& o, const std::vector<Request>& reqs,
                       const infer::SamplingOptions& sampling = {},
                       const std::optional<SpeculativeShape>& speculative = std::nullopt) {
  ClusterOptions co;
  co.world_size = s.tp * s.pp * s.ep;
  Cluster cluster(load_profile("a100-nvlink"), co);
  ReplicaShape shape{c, s.tp, s.pp, s.ep, /*phantom=*/false, 1, &init};
  shape.sampling = sampling;
  shape.virtual_engines = o.virtual_engines;
  shape.speculative = speculative;
  ClusterStepExecutor ex(cluster, shape);
  Recording rec(ex);
  Served out{simulate_replica(reqs, o, rec), 0, 0, 0};
  ex.finish();
  out.chunks_without_token = rec.chunks_without_token;
  out.tokens_fed = rec.tokens_fed;
  out.new_tokens = rec.new_tokens;
  out.evictions = rec.evictions;
  out.drafts = rec.drafts;
  out.accepted = rec.accepted;
  return out;
}

// A draft for `c`: its first 2 layers' shape, other weights.
Tiny two_layer_draft(model::GPTConfig c) {
  c.n_layer = 2;
  model::GPT<float> other(c, 11);
  infer::testing::perturb(other, 11);
  return {c, infer::testing::as_checkpoint(other)};
}

// Sampled at a high temperature over the top 40 and a 0.95 nucleus: tokens
// far from the greedy ones.
const infer::SamplingOptions kSampled{1.5, 40, 500, 0.95};

void expect_config_generates_tokens(const model::GPTConfig& c, const std::vector<Split>& splits,
                                    const infer::SamplingOptions& sampling = {}) {
  const bool moe = c.is_moe();
  model::GPT<float> ref(c, 7);
  infer::testing::perturb(ref);
  const model::SafetensorsFile init = infer::testing::as_checkpoint(ref);
  const std::vector<Request> reqs = workload(c.token_vocab());
  std::vector<std::vector<Token>> want;
  for (const Request& r : reqs) want.push_back(alone(c, init, r, sampling));
  // 8 blocks of 4 tokens against 79 tokens the requests hold at their end;
  // at most 6 prefill tokens a step.
  SchedulerOptions o;
  o.kv_blocks = 8;
  o.kv_block = 4;
  o.chunked_prefill = 6;
  for (const Split& s : splits) {
    const Served got = serve_on_values(c, init, s, o, reqs, sampling);
    std::printf("%s%s%s: %lld steps, %lld preemptions, %d chunks without a token, %lld token ids fed\n",
                moe ? "MoE " : "", sampling.temperature > 0 ? "sampled " : "", s.name().c_str(), (long long)got.result.steps,
                (long long)got.result.preemptions, got.chunks_without_token, (long long)got.tokens_fed);
    EXPECT_GT(got.result.preemptions, 0) << s.name();
    EXPECT_GT(got.chunks_without_token, 0) << s.name();
    EXPECT_EQ(got.tokens_fed, got.new_tokens) << s.name();  // every new token carried its id
    ASSERT_EQ(got.result.requests.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got.result.requests[i].tokens, want[i]) << s.name() << ", request " << i;
  }
}

void expect_generates_tokens(bool moe, const std::vector<Split>& splits,
                             const infer::SamplingOptions& sampling = {}) {
  expect_config_generates_tokens(infer::testing::small_config(moe), splits, sampling);
}

// The llama family (RoPE at cached positions, GQA with 2 K/V heads: split at
// tp 2, replicated at tp 4) and its SwiGLU experts (ep 2, tp 2).
TEST(ServeTokens, LlamaFamilyBeyondTp2GivesGeneratesTokens) {
  model::GPTConfig c = infer::testing::small_config(false);
  c.family = model::Family::kLlama, c.n_kv_head = 2, c.n_ffn = 96;
  expect_config_generates_tokens(c, {{1, 1, 1}, {4, 1, 1}, {1, 2, 1}, {4, 2, 1}});
  c.n_expert = 4, c.top_k = 2, c.n_moe_ffn = 32, c.n_shared_expert = 1, c.moe_first_dense = 1;
  expect_config_generates_tokens(c, {{1, 1, 1}, {2, 1, 1}, {1, 1, 2}, {2, 2, 1}});
}

// Multi-head latent attention: the latent cache under continuous batching,
// preemption and chunked prefill (decode and prefill sequences in one step).
TEST(ServeTokens, MlaLatentCacheGivesGeneratesTokens) {
  expect_config_generates_tokens(infer::testing::mla_config(), {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}});
}

TEST(ServeTokens, ContinuousBatchingGivesEachRequestGeneratesTokens) {
  expect_generates_tokens(false, {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 1}});
}

TEST(ServeTokens, MoeUnderExpertParallelismGivesGeneratesTokens) {
  expect_generates_tokens(true, {{1, 1, 1}, {1, 1, 2}});
}

TEST(ServeTokens, SampledRequestsDrawGeneratesTokensWithSeedPlusId) {
  expect_generates_tokens(false, {{2, 1, 1}, {1, 2, 1}}, kSampled);
  expect_generates_tokens(true, {{1, 1, 2}}, kSampled);
  // The draws are not greedy's: the same run without sampling differs.
  const Tiny t = tiny(false);
  const model::GPTConfig& c = t.c;
  const model::SafetensorsFile& init = t.init;
  const Request r = workload(c.token_vocab())[2];
  EXPECT_NE(alone(c, init, r, kSampled), alone(c, init, r));
}

// Static batching reserves every request's whole KV: no preemption, no
// chunks; the tokens are generate's too, greedy and sampled.
TEST(ServeTokens, StaticBatchingGivesGeneratesTokens) {
  const Tiny t = tiny(false);
  const model::GPTConfig& c = t.c;
  const model::SafetensorsFile& init = t.init;
  const std::vector<Request> reqs = workload(c.token_vocab());
  SchedulerOptions o;
  o.batching = Batching::kStatic;
  o.kv_blocks = 40;
  o.kv_block = 4;
  for (const infer::SamplingOptions& sampling : {infer::SamplingOptions{}, kSampled}) {
    const Served got = serve_on_values(c, init, {2, 1, 1}, o, reqs, sampling);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got.result.requests[i].tokens, alone(c, init, reqs[i], sampling))
          << "request " << i << ", temperature " << sampling.temperature;
  }
}

// Prefix caching on values: requests of two shared prefixes (8 and 12
// tokens) in chunks of 6, on 6 blocks of 4 (evictions and preemptions):
// a request's prefill starts on the K and V another one computed, and its
// tokens are still generate's, greedy and sampled.
TEST(ServeTokens, PrefixCachingGivesGeneratesTokens) {
  const Tiny t = tiny(false);
  const model::GPTConfig& c = t.c;
  const model::SafetensorsFile& init = t.init;
  std::vector<Request> reqs = {{0, 0, 12, 6, {}, 0, 8},      {1, 0.001, 10, 5, {}, 0, 8}, {2, 0.0015, 14, 4, {}, 1, 12},
                               {3, 0.002, 13, 6, {}, 1, 12}, {4, 0.003, 9, 7, {}, 0, 8},  {5, 0.004, 12, 3, {}, 1, 12}};
  draw_prompts(reqs, c.token_vocab(), 21);
  ASSERT_EQ(std::vector<Token>(reqs[0].prompt.begin(), reqs[0].prompt.begin() + 8),
            std::vector<Token>(reqs[4].prompt.begin(), reqs[4].prompt.begin() + 8));
  SchedulerOptions o;
  o.kv_blocks = 6;
  o.kv_block = 4;
  o.chunked_prefill = 6;
  o.prefix_caching = true;
  for (const infer::SamplingOptions& sampling : {infer::SamplingOptions{}, kSampled})
    for (const Split& s : {Split{1, 1, 1}, Split{2, 1, 1}, Split{1, 2, 1}}) {
      const Served got = serve_on_values(c, init, s, o, reqs, sampling);
      std::printf("prefix caching, %s%s: %lld of %lld prompt tokens cached, %d evictions, %lld preemptions\n",
                  sampling.temperature > 0 ? "sampled " : "", s.name().c_str(), (long long)got.result.prefix_hit_tokens,
                  (long long)got.result.prefix_query_tokens, got.evictions, (long long)got.result.preemptions);
      EXPECT_GT(got.result.prefix_hit_tokens, 0) << s.name();
      EXPECT_GT(got.evictions, 0) << s.name();  // the test covers a block's reuse
      EXPECT_GT(got.result.preemptions, 0) << s.name();
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(got.result.requests[i].tokens, alone(c, init, reqs[i], sampling)) << s.name() << ", request " << i;
    }
}

// Two batches in flight through 2 stages (virtual engines): the devices
// interleave the engines' steps, each request's tokens are generate's.
TEST(ServeTokens, TwoVirtualEnginesThroughTwoStagesGiveGeneratesTokens) {
  const Tiny t = tiny(false);
  const model::GPTConfig& c = t.c;
  const model::SafetensorsFile& init = t.init;
  const std::vector<Request> reqs = workload(c.token_vocab());
  SchedulerOptions o;
  o.kv_blocks = 40;
  o.kv_block = 4;
  o.virtual_engines = 2;
  for (const infer::SamplingOptions& sampling : {infer::SamplingOptions{}, kSampled})
    for (const Split& s : {Split{1, 2, 1}, Split{2, 2, 1}}) {
      const Served got = serve_on_values(c, init, s, o, reqs, sampling);
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(got.result.requests[i].tokens, alone(c, init, reqs[i], sampling)) << s.name() << ", request " << i;
    }
}

// Greedy speculative decoding (k = 3) under continuous batching with
// chunks and preemptions: with the target itself as the draft every
// proposal is accepted; with a 2-layer draft of other weights some are
// not. Either way each request's tokens are generate's (no draft).
TEST(ServeTokens, GreedySpeculativeDecodingGivesGeneratesTokens) {
  const Tiny t = tiny(false);
  const std::vector<Request> reqs = workload(t.c.token_vocab());
  std::vector<std::vector<Token>> want;
  for (const Request& r : reqs) want.push_back(alone(t.c, t.init, r));
  const Tiny draft = two_layer_draft(t.c);
  const model::GPTConfig& small = draft.c;
  const model::SafetensorsFile& other_init = draft.init;
  SchedulerOptions o;
  o.kv_blocks = 10;
  o.kv_block = 4;
  o.chunked_prefill = 6;
  o.speculative = 3;
  for (const bool self : {true, false})
    for (const Split& s : {Split{1, 1, 1}, Split{2, 1, 1}}) {
      const SpeculativeShape spec{self ? t.c : small, self ? &t.init : &other_init, 1, 3, -1};
      const Served got = serve_on_values(t.c, t.init, s, o, reqs, {}, spec);
      std::printf("draft %s, %s: %lld of %lld drafts accepted, %lld preemptions\n", self ? "= target" : "2 layers",
                  s.name().c_str(), (long long)got.accepted, (long long)got.drafts, (long long)got.result.preemptions);
      EXPECT_GT(got.drafts, 0);
      if (self) EXPECT_EQ(got.accepted, got.drafts) << s.name();
      else EXPECT_LT(got.accepted, got.drafts) << s.name();
      for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.result.requests[i].tokens, want[i]) << s.name() << ", request " << i;
    }
}

// Sampled speculative decoding (Leviathan's rule): a request's first token
// is the prefill's draw, generate's; with the target as its own draft q
// equals p up to the rounding of a batch of 1 against one of k + 1 rows, so
// almost every proposal is kept; a 2-layer draft has fewer kept.
TEST(ServeTokens, SampledSpeculativeDecodingDrawsTheTargetsTokens) {
  const Tiny t = tiny(false);
  const std::vector<Request> reqs = workload(t.c.token_vocab());
  const Tiny draft = two_layer_draft(t.c);
  const model::GPTConfig& small = draft.c;
  const model::SafetensorsFile& other_init = draft.init;
  SchedulerOptions o;
  o.kv_blocks = 40;
  o.kv_block = 4;
  o.speculative = 3;
  double rate[2] = {};
  for (const bool self : {true, false}) {
    const SpeculativeShape spec{self ? t.c : small, self ? &t.init : &other_init, 1, 3, -1};
    const Served got = serve_on_values(t.c, t.init, {2, 1, 1}, o, reqs, kSampled, spec);
    rate[self] = double(got.accepted) / double(got.drafts);
    std::printf("sampled, draft %s: %lld of %lld drafts kept\n", self ? "= target" : "2 layers",
                (long long)got.accepted, (long long)got.drafts);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got.result.requests[i].tokens.size(), size_t(reqs[i].output_len));
      EXPECT_EQ(got.result.requests[i].tokens[0], alone(t.c, t.init, reqs[i], kSampled)[0]) << "request " << i;
    }
  }
  EXPECT_GE(rate[1], 0.9);
  EXPECT_LT(rate[0], rate[1]);
}

TEST(ServeTokens, DrawnPromptsAreInTheVocabularyAndRepeat) {
  const std::vector<Request> a = workload(100), b = workload(100);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].prompt.size(), size_t(a[i].prompt_len));
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    for (Token t : a[i].prompt) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 100);
    }
  }
  EXPECT_NE(std::vector<Token>(a[0].prompt.begin(), a[0].prompt.begin() + 5), a[2].prompt);  // not one stream
}

}  // namespace
}  // namespace shardlab::serve
