// Small model configs and helpers shared by the GPT tests.
#pragma once

#include <random>
#include <vector>

#include "model/gpt.h"

namespace shardlab::model::testing {

// Perturbs every parameter (so gradients are not tiny and attention is not
// uniform): weights N(0, scale), LayerNorm weights 1 + N(0, 0.1), biases N(0, 0.1).
template <typename Real>
void randomize_params(GPT<Real>& model, uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  for (const ParamSpec& spec : model.table().specs()) {
    Real* p = model.params().data() + spec.offset;
    for (int64_t i = 0; i < spec.numel; ++i) {
      const double z = dist(rng);
      if (spec.init == InitKind::kOnes) {
        p[i] = static_cast<Real>(1 + 0.1 * z);
      } else if (spec.init == InitKind::kZeros) {
        p[i] = static_cast<Real>(0.1 * z);
      } else {
        p[i] = static_cast<Real>(scale * z);
      }
    }
  }
}

inline std::vector<Token> random_tokens(uint64_t seed, size_t n, int vocab) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<Token> t(n);
  for (Token& v : t) v = dist(rng);
  return t;
}

}  // namespace shardlab::model::testing
