// serve_checks.h: the requests against the model, and the host memory of a
// run on values, before any thread starts.
#include "model/serve/serve_checks.h"

#include <string>

#include <gtest/gtest.h>

#include "model/params.h"
#include "support/config_error.h"

namespace shardlab::serve {
namespace {

using testing::config_error_of;

Request request(int id, int prompt_len, int output_len, std::vector<model::Token> prompt = {}) {
  Request r;
  r.id = id;
  r.prompt_len = prompt_len;
  r.output_len = output_len;
  r.prompt = std::move(prompt);
  return r;
}

TEST(ServeChecks, RequestsMustFitTheVocabularyAndTheContext) {
  const model::GPTConfig m = model::preset("nano");  // context 32, vocabulary 256
  ASSERT_EQ(m.block_size, 32);
  ASSERT_EQ(m.token_vocab(), 256);
  // The last generated token is never fed back: prompt + output - 1 <= context.
  EXPECT_EQ(config_error_of([&] { check_requests(m, {request(0, 28, 5)}, {}); }), "(no ConfigError)");
  EXPECT_EQ(config_error_of([&] { check_requests(m, {request(0, 28, 5), request(1, 28, 6)}, {}); }),
            "request 1: prompt 28 + output 6 - 1 tokens exceed the model's context of 32 (`block_size`)");
  EXPECT_EQ(config_error_of([&] { check_requests(m, {request(0, 128, 128)}, {"", 128}); }),
            "request 0: prompt 128 + output 128 - 1 tokens exceed the model's context of 32 (`block_size`); "
            "`prompt_len` and `output_len` are 128 unless given: give lengths that fit");
  EXPECT_EQ(config_error_of([&] { check_requests(m, {request(0, 2, 1, {255, 256})}, {"w.csv", 0}); }),
            "`workload` w.csv: request 0: token 256 at position 1 is outside the vocabulary [0, 256)");
}

// The need is 4 bytes per parameter plus K and V of a whole context (fp32)
// per running sequence and ep replica; refused above 80% of the host.
TEST(ServeChecks, HostMemoryCountsTheRunningSequences) {
  ReplicaShape shape;
  shape.model = model::preset("nano");
  shape.ep = 1;
  const model::GPTConfig& m = shape.model;
  const double weights = 4.0 * double(model::count_params(m));
  const double per_sequence = 2.0 * m.n_layer * m.n_embd * m.block_size * 4;
  const uint64_t host = uint64_t((weights + 10.5 * per_sequence) / 0.8) + 100;  // room for 10 sequences, not 11
  EXPECT_EQ(config_error_of([&] { check_host_memory(shape, 1000, 10, host); }), "(no ConfigError)");
  EXPECT_EQ(config_error_of([&] { check_host_memory(shape, 10, 256, host); }), "(no ConfigError)");
  const std::string refused = config_error_of([&] { check_host_memory(shape, 1000, 11, host); });
  EXPECT_NE(refused.find("for each of 11 running sequences"), std::string::npos) << refused;
  EXPECT_NE(refused.find("`max_seqs`, or `phantom`"), std::string::npos) << refused;
  shape.ep = 2;  // two replicas of the batch: twice the contexts
  EXPECT_NE(config_error_of([&] { check_host_memory(shape, 1000, 10, host); }), "(no ConfigError)");
}

// The draft model of speculative decoding is held beside the target: its
// fp32 weights and its contexts count too; a disaggregated run's K and V on
// their way (fp32, every layer) as well.
TEST(ServeChecks, HostMemoryCountsTheDraftAndTheHandedCache) {
  ReplicaShape shape;
  shape.model = model::preset("nano");
  const model::GPTConfig& m = shape.model;
  const double weights = 4.0 * double(model::count_params(m));
  const double per_sequence = 2.0 * m.n_layer * m.n_embd * m.block_size * 4;
  const uint64_t host = uint64_t((weights + 2.5 * per_sequence) / 0.8) + 100;  // the target and 2 sequences
  EXPECT_EQ(config_error_of([&] { check_host_memory(shape, 2, 2, host); }), "(no ConfigError)");
  shape.speculative = SpeculativeShape{model::preset("nano"), nullptr, 1, 2, -1};  // twice the weights and contexts
  const std::string refused = config_error_of([&] { check_host_memory(shape, 2, 2, host); });
  EXPECT_NE(refused.find("the draft model's too"), std::string::npos) << refused;
  shape.speculative.reset();
  // Replicas routed side by side (serving.h) each hold their weights and contexts.
  EXPECT_NE(config_error_of([&] { check_host_memory(shape, 2, 2, host, 0, 2); }), "(no ConfigError)");
  // Half a context per token of a layer-width row pair: 0.5 · block_size tokens fit, 0.6 do not.
  const int64_t half = m.block_size / 2;
  EXPECT_EQ(config_error_of([&] { check_host_memory(shape, 2, 2, host, half - 1); }), "(no ConfigError)");
  EXPECT_NE(config_error_of([&] { check_host_memory(shape, 2, 2, host, half + m.block_size / 8); }), "(no ConfigError)");
}

}  // namespace
}  // namespace shardlab::serve
