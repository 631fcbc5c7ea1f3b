#include "model/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/errors.h"

namespace shardlab::infer {

double Sampler::uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9e37'79b9'7f4a'7c15ull * (index + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58'476d'1ce4'e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d0'49bb'1331'11ebull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

model::Token Sampler::next(std::span<const float> logits) {
  SHARDLAB_CHECK(!logits.empty(), "sampling needs logits");
  const int n = int(logits.size());
  // Candidates by decreasing logit, the lower id first on ties.
  std::vector<int> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  if (o_.temperature <= 0) return *std::min_element(ids.begin(), ids.end(), before);
  const int k = o_.top_k > 0 ? std::min(o_.top_k, n) : n;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  // softmax(z / T) over the k candidates, in double.
  std::vector<double> p(static_cast<size_t>(k));
  const double zmax = logits[size_t(ids[0])];
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[size_t(i)] = std::exp((logits[size_t(ids[size_t(i)])] - zmax) / o_.temperature);
  const double u = uniform(o_.seed, draws_++) * sum;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[size_t(i)];
    if (u < acc) return ids[size_t(i)];
  }
  return ids[size_t(k - 1)];
}

}  // namespace shardlab::infer
