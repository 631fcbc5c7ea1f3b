// Small model configs and helpers shared by the GPT tests.
#pragma once

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gradcheck.h"
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

// Every tensor of a double-precision model (randomized) against central
// differences of its loss; EXPECTs each within `tol` and prints one line
// per model with the worst tensor.
inline void check_model_gradients(const GPTConfig& config, const char* what, int B, int T, double tol) {
  GPT<double> model(config, 7);
  randomize_params(model, 99, 0.3);
  const auto inputs = random_tokens(1, size_t(B) * T, config.vocab_size);
  const auto targets = random_tokens(2, size_t(B) * T, config.vocab_size);
  auto loss = [&] { return model.forward(inputs.data(), targets.data(), B, T); };
  model.zero_grad();
  loss();
  model.backward();
  const std::vector<double> analytic(model.grads().begin(), model.grads().end());
  double worst = 0;
  int64_t non_finite = 0;
  std::string worst_name;
  for (const ParamSpec& spec : model.table().specs()) {
    const auto numeric = numeric_grad(loss, model.params().data() + spec.offset, spec.numel);
    const GradError e = compare_grads(analytic.data() + spec.offset, numeric);
    EXPECT_TRUE(grads_close(analytic.data() + spec.offset, numeric, tol))
        << what << " " << spec.name << " (analytic vs numeric)";
    if (e.max_rel >= worst) worst = e.max_rel, worst_name = spec.name;
    non_finite += e.non_finite;
  }
  std::printf(
      "[gradcheck] %-28s all %zu tensors (%lld params)  max rel err %.3e in %s  (tol %.0e)  "
      "non-finite %lld\n",
      what, model.table().specs().size(), static_cast<long long>(model.table().numel()), worst,
      worst_name.c_str(), tol, static_cast<long long>(non_finite));
}

}  // namespace shardlab::model::testing
