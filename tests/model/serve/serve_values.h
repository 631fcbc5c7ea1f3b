// What the tests of serving on values share: a small workload, the
// small model with perturbed weights, and generate()'s tokens for one
// request alone.
#pragma once

#include <vector>

#include "model/serve/workload.h"
#include "tests/model/infer/infer_test_util.h"

namespace shardlab::serve {

// Five requests of 5..14 prompt tokens and 5..10 new ones: three at once,
// two arriving while they decode (a step of this model takes about 0.5 ms).
inline std::vector<Request> workload(int vocab) {
  std::vector<Request> r = {{0, 0, 9, 8, {}},      {1, 0, 14, 6, {}},    {2, 0, 5, 10, {}},
                            {3, 0.002, 11, 5, {}}, {4, 0.003, 7, 9, {}}};
  draw_prompts(r, vocab, 21);
  return r;
}

// generate() of one request's prompt alone, unsharded; sampled from the
// serving seed + the request's id.
inline std::vector<model::Token> alone(const model::GPTConfig& c, const model::SafetensorsFile& init,
                                       const Request& r, infer::SamplingOptions sampling = {}) {
  infer::GenerateOptions o;
  o.model = c;
  o.init = &init;
  o.prompt = r.prompt;
  o.max_new_tokens = r.output_len;
  sampling.seed += uint64_t(r.id);
  o.sampling = sampling;
  return infer::testing::run_generate(o).tokens;
}

// The small model with perturbed weights, as a checkpoint.
struct Tiny {
  model::GPTConfig c;
  model::SafetensorsFile init;
};

inline Tiny tiny(bool moe) {
  const model::GPTConfig c = infer::testing::small_config(moe);
  model::GPT<float> ref(c, 7);
  infer::testing::perturb(ref);
  return {c, infer::testing::as_checkpoint(ref)};
}

}  // namespace shardlab::serve
