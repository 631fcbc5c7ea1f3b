// Serving on the model's values: under continuous batching (several
// requests at once, arrivals while others decode, chunked prefill, a cache
// small enough to preempt and recompute) every request's tokens equal those
// `generate` produces for its prompt alone, greedy or sampled (request i
// with generate's seed S + i), unsharded and under tp 2, pp 2 and, for an
// MoE model, ep 2; the llama family also under tp 4 (K/V replicated).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "model/serve/cluster_step.h"
#include "model/serve/serving.h"
#include "tests/model/infer/infer_test_util.h"

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
      new_tokens += e.new_tokens;
    }
    return ex.run_step(batch);
  }
  void begin_step(int replica, double now_s) override { ex.begin_step(replica, now_s); }
  void release(int seq) override { ex.release(seq); }
  ClusterStepExecutor& ex;
  int chunks_without_token = 0;
  int64_t tokens_fed = 0, new_tokens = 0;
};

// Five requests of 5..14 prompt tokens and 5..10 new ones: three at once,
// two arriving while they decode (a step of this model takes about 0.5 ms).
std::vector<Request> workload(int vocab) {
  std::vector<Request> r = {{0, 0, 9, 8, {}},      {1, 0, 14, 6, {}},    {2, 0, 5, 10, {}},
                            {3, 0.002, 11, 5, {}}, {4, 0.003, 7, 9, {}}};
  draw_prompts(r, vocab, 21);
  return r;
}

struct Split {
  int tp = 1, pp = 1, ep = 1;
  std::string name() const { return fmt::format("tp {} pp {} ep {}", tp, pp, ep); }
};

struct Served {
  ReplicaResult result;
  int chunks_without_token = 0;
  int64_t tokens_fed = 0, new_tokens = 0;
};

Served serve_on_values(const model::GPTConfig& c, const model::SafetensorsFile& init, Split s,
                       const SchedulerOptions& o, const std::vector<Request>& reqs,
                       const infer::SamplingOptions& sampling = {}) {
  ClusterOptions co;
  co.world_size = s.tp * s.pp * s.ep;
  Cluster cluster(load_profile("a100-nvlink"), co);
  ReplicaShape shape{c, s.tp, s.pp, s.ep, /*phantom=*/false, 1, &init};
  shape.sampling = sampling;
  ClusterStepExecutor ex(cluster, shape);
  Recording rec(ex);
  Served out{simulate_replica(reqs, o, rec), 0, 0, 0};
  ex.finish();
  out.chunks_without_token = rec.chunks_without_token;
  out.tokens_fed = rec.tokens_fed;
  out.new_tokens = rec.new_tokens;
  return out;
}

// generate() of one request's prompt alone, unsharded; sampled from the
// serving seed + the request's id.
std::vector<Token> alone(const model::GPTConfig& c, const model::SafetensorsFile& init, const Request& r,
                         infer::SamplingOptions sampling = {}) {
  infer::GenerateOptions o;
  o.model = c;
  o.init = &init;
  o.prompt = r.prompt;
  o.max_new_tokens = r.output_len;
  sampling.seed += uint64_t(r.id);
  o.sampling = sampling;
  return infer::testing::run_generate(o).tokens;
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
  const model::GPTConfig c = infer::testing::small_config(false);
  model::GPT<float> ref(c, 7);
  infer::testing::perturb(ref);
  const model::SafetensorsFile init = infer::testing::as_checkpoint(ref);
  const Request r = workload(c.token_vocab())[2];
  EXPECT_NE(alone(c, init, r, kSampled), alone(c, init, r));
}

// Static batching reserves every request's whole KV: no preemption, no
// chunks; the tokens are generate's too, greedy and sampled.
TEST(ServeTokens, StaticBatchingGivesGeneratesTokens) {
  const model::GPTConfig c = infer::testing::small_config(false);
  model::GPT<float> ref(c, 7);
  infer::testing::perturb(ref);
  const model::SafetensorsFile init = infer::testing::as_checkpoint(ref);
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
