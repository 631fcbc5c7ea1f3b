// Choosing the next token from the full logits of one sequence: greedy
// (temperature 0), or a draw from softmax(logits / T) over the top_k largest
// (all when top_k is 0) and, with top_p below 1, over the smallest set of
// the most likely of those whose probability reaches top_p (nucleus
// sampling, Holtzman et al. 2020, as vLLM and HF apply it after top-k), from
// a seeded counter-based generator. The draw depends only on (seed, draw
// index, the logits), never on how the model was split: generate takes it on
// one rank from the gathered logits and broadcasts the token; serve draws
// request i's n-th token with seed + i and index n, whatever the batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/kernels.h"

namespace shardlab::infer {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax, the lowest id on ties)
  int top_k = 0;           // 0: every token
  uint64_t seed = 1337;
  double top_p = 1.0;  // (0, 1]; 1: every candidate
};

// ConfigError naming the field (`temperature`, `top_k`, `top_p`) for a value
// out of range, or a filter without a temperature (greedy filters nothing).
void validate(const SamplingOptions& o);

// Which draw picks a token: of the stream `seed`, number `index`.
struct DrawKey {
  uint64_t seed = 0, index = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : o_(o) {}
  // The next token among logits[0, n). Each call is one draw.
  model::Token next(std::span<const float> logits) { return draw(logits, o_.seed, draws_++); }
  // Draw `index` of the stream `seed` (the options' seed unused).
  model::Token draw(std::span<const float> logits, uint64_t seed, uint64_t index);
  // The uniform in [0, 1) of draw `index` (splitmix64 of seed and index).
  static double uniform(uint64_t seed, uint64_t index);
  // The distribution draw() samples from, over every token of `logits`
  // (one-hot on the greedy token at temperature 0); `out` is resized.
  void distribution(std::span<const float> logits, std::vector<double>& out);

 private:
  // Sorts the candidates into ids_ and their unnormalised probabilities
  // into p_ (temperature > 0); returns how many are kept, `mass` their sum.
  int candidates(std::span<const float> logits, double& mass);

  SamplingOptions o_;
  uint64_t draws_ = 0;
  std::vector<int> ids_;     // scratch: candidates by decreasing logit
  std::vector<double> p_;    // scratch: their unnormalised probabilities
};

}  // namespace shardlab::infer
