#include "model/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::infer {

void validate(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || o.temperature > 1e6)
    throw ConfigError(fmt::format("`temperature` must be between 0 and 1e6 (got {})", o.temperature));
  if (o.top_k < 0) throw ConfigError(fmt::format("`top_k` must be at least 0 (got {})", o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) throw ConfigError(fmt::format("`top_p` must be in (0, 1] (got {})", o.top_p));
  if (o.temperature > 0) return;
  if (o.top_k > 0)
    throw ConfigError(fmt::format("`top_k` {} filters sampling: it needs `temperature` above 0 (0 is greedy, the "
                                  "most likely token)", o.top_k));
  if (o.top_p < 1)
    throw ConfigError(fmt::format("`top_p` {} filters sampling: it needs `temperature` above 0 (0 is greedy, the "
                                  "most likely token)", o.top_p));
}

double Sampler::uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9e37'79b9'7f4a'7c15ull * (index + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58'476d'1ce4'e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d0'49bb'1331'11ebull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

int Sampler::candidates(std::span<const float> logits, double& mass) {
  const int n = int(logits.size());
  // Candidates by decreasing logit, the lower id first on ties.
  auto before = [&](int a, int b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  ids_.resize(size_t(n));
  std::iota(ids_.begin(), ids_.end(), 0);
  if (o_.temperature <= 0) {  // the greedy token alone
    std::iter_swap(ids_.begin(), std::min_element(ids_.begin(), ids_.end(), before));
    p_.assign(1, 1.0);
    mass = 1;
    return 1;
  }
  int k = o_.top_k > 0 ? std::min(o_.top_k, n) : n;
  std::partial_sort(ids_.begin(), ids_.begin() + k, ids_.end(), before);
  // softmax(z / T) over the k candidates, in double.
  p_.resize(size_t(k));
  const double zmax = logits[size_t(ids_[0])];
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p_[size_t(i)] = std::exp((logits[size_t(ids_[size_t(i)])] - zmax) / o_.temperature);
  if (o_.top_p < 1) {  // keep the most likely until their mass reaches top_p (at least one)
    double kept = 0;
    int keep = 0;
    while (keep < k && kept < o_.top_p * sum) kept += p_[size_t(keep++)];
    k = keep;
    sum = kept;
  }
  mass = sum;
  return k;
}

void Sampler::distribution(std::span<const float> logits, std::vector<double>& out) {
  SHARDLAB_CHECK(!logits.empty(), "sampling needs logits");
  double sum = 0;
  const int k = candidates(logits, sum);
  out.assign(logits.size(), 0.0);
  for (int i = 0; i < k; ++i) out[size_t(ids_[size_t(i)])] = p_[size_t(i)] / sum;
}

model::Token Sampler::draw(std::span<const float> logits, uint64_t seed, uint64_t index) {
  SHARDLAB_CHECK(!logits.empty(), "sampling needs logits");
  double sum = 0;
  const int k = candidates(logits, sum);
  if (o_.temperature <= 0) return ids_[0];
  const double u = uniform(seed, index) * sum;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p_[size_t(i)];
    if (u < acc) return ids_[size_t(i)];
  }
  return ids_[size_t(k - 1)];
}

}  // namespace shardlab::infer
