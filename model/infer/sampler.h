// Choosing the next token from the full logits of one sequence: greedy
// (temperature 0), or a draw from softmax(logits / T) over the top_k largest
// (all when top_k is 0), from a seeded counter-based generator. The draw
// depends only on (seed, draw index, the logits), never on how the model was
// split: generate takes it on one rank from the gathered logits and
// broadcasts the token.
#pragma once

#include <cstdint>
#include <span>

#include "model/config.h"
#include "model/kernels.h"

namespace shardlab::infer {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax, the lowest id on ties)
  int top_k = 0;           // 0: every token
  uint64_t seed = 1337;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : o_(o) {}
  // The next token among logits[0, n). Each call is one draw.
  model::Token next(std::span<const float> logits);
  // The uniform in [0, 1) of draw `index` (splitmix64 of seed and index).
  static double uniform(uint64_t seed, uint64_t index);

 private:
  SamplingOptions o_;
  uint64_t draws_ = 0;
};

}  // namespace shardlab::infer
