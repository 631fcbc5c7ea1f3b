// generate(): autoregressive generation of one prompt on the virtual
// cluster, every device running an InferEngine (engine.h) on its part of the
// model: one prefill step over the prompt, then one decode step per new
// token over the KV cache.
//
// The token is chosen on one rank — the last pipeline stage's tp rank 0 of
// ep rank 0 (the sampler rank) — from the full gathered logits, and
// broadcast to every device (a collective on the clock), so the tokens do not
// depend on the parallel split. Times are that rank's compute clock when
// it has chosen each token: TTFT is the first (prefill, from time 0), each
// decode step the gap to the next (what a client sees between tokens).
//
// Under mpirun (runtime/transport.h) every process runs its own devices and
// then holds the whole GenerateResult, the single-process run's.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/infer/sampler.h"
#include "model/io/safetensors.h"
#include "runtime/cluster.h"

namespace shardlab::infer {

struct GenerateOptions {
  model::GPTConfig model;
  uint64_t seed = 1337;                        // the init without a checkpoint
  const model::SafetensorsFile* init = nullptr;  // checked with check_generate_init
  std::vector<model::Token> prompt;
  int max_new_tokens = 16;
  SamplingOptions sampling;
  int tp = 1, pp = 1, ep = 1;
  bool phantom = false;      // shapes only: every new token is 0
  bool keep_logits = false;  // GenerateResult::logits
  bool kv_fp8 = false;       // the KV cache in FP8 (InferPlan::kv_fp8)
  int world() const { return tp * pp * ep; }
};

struct GenerateResult {
  std::vector<model::Token> tokens;  // the new tokens
  Time ttft = 0;                     // prefill: the first token chosen
  std::vector<Time> decode_steps;    // between successive tokens
  std::vector<uint64_t> kv_bytes;    // per device, modeled, at the end
  std::vector<int64_t> kv_tokens;    // per device, at the end
  std::vector<std::vector<float>> logits;  // keep_logits: each step's (token_vocab)
  int sampler_rank = 0;
  RunResult run;
  double tpot_seconds() const;  // mean decode step (0 with one new token)
};

// ConfigError (one line naming the option field, `max_new_tokens`) for a bad
// prompt, length, sampling or parallel shape, before any thread starts.
void validate(const GenerateOptions& o);
// The checkpoint holds exactly the model's tensors with its shapes (and, if
// shardlab wrote it, the same config); ConfigError otherwise.
void check_generate_init(const model::SafetensorsFile& f, const model::GPTConfig& config);

GenerateResult generate(Cluster& cluster, const GenerateOptions& o);

}  // namespace shardlab::infer
