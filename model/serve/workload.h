// The requests a serving simulation replays: when each arrives, how long its
// prompt is and how many tokens it asks for.
//
// A workload is drawn from an arrival process and two length distributions,
// all from counter-based random streams of one seed (model/rng.h), so the same
// flags give the same requests on every host; or it is read from a trace file
// of (arrival_s, prompt_len, output_len[, prompt_tokens]) rows.
//
//   arrival   poisson:RATE   exponential gaps, RATE requests per second
//             burst          every request at time 0 (a saturation test)
//   lengths   N              a constant
//             uniform:A:B    integers in [A, B]
//             lognormal:MEDIAN:SIGMA[:MAX]
//                            exp(N(ln MEDIAN, SIGMA)) rounded, clamped to
//                            [1, MAX] (MAX default 8 x MEDIAN): the long
//                            tail of chat workloads (ShareGPT's lengths are
//                            roughly lognormal)
//
// Every parse error is a ConfigError naming the option (`arrival`, `workload`,
// or parse_length_dist's `flag`).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/kernels.h"

namespace shardlab::serve {

struct Request {
  int id = 0;
  double arrival_s = 0;
  int prompt_len = 1;
  int output_len = 1;  // tokens generated, the first one by the prefill
  std::vector<model::Token> prompt;  // prompt_len ids, or empty (lengths only)
  // Without ids: the first prefix_len tokens are those of every request of
  // the same prefix_id (a system prompt, an earlier turn); -1: none shared.
  int prefix_id = -1;
  int prefix_len = 0;
  // Disaggregated serving (serving.h). `hand_off`: on a prefill replica,
  // its K and V go to a decode replica when its prefill ends (output_len 1).
  // `handed`: on a decode replica, it arrives with its prompt's K and V and
  // its first token (`first`, with prompt ids) computed.
  bool hand_off = false;
  bool handed = false;
  model::Token first = 0;
};

// What names token t of a request's text (its prompt, then the tokens it
// produced) for prefix caching: its id (`ids`: the prompt's, then the
// produced ones), or without ids, its prefix's (prefix_id, t) below
// prefix_len and a key of its own (id, t) after it. content_keys: the
// prompt's.
uint64_t content_key(const Request& r, std::span<const model::Token> ids, int64_t t);
std::vector<uint64_t> content_keys(const Request& r);

struct LengthDist {
  enum class Kind { kConstant, kUniform, kLognormal } kind = Kind::kConstant;
  int a = 1, b = 1;        // constant a; uniform [a, b]; lognormal: max b
  double median = 1, sigma = 0;
  int max() const { return kind == Kind::kConstant ? a : b; }
};
LengthDist parse_length_dist(const std::string& text, const std::string& flag);

struct Arrival {
  enum class Kind { kPoisson, kBurst } kind = Kind::kBurst;
  double rate = 0;  // requests per second (poisson)
};
Arrival parse_arrival(const std::string& text);  // --arrival

// `n` requests with ids 0..n-1 in arrival order. `shared_prefix` > 0: every
// prompt starts with the same shared_prefix tokens (prefix 0), then its own
// `prompt` tokens.
std::vector<Request> make_workload(int n, const Arrival& arrival, const LengthDist& prompt,
                                   const LengthDist& output, uint64_t seed, int shared_prefix = 0);

// Gives every request without prompt ids prompt_len ids drawn uniformly
// from [0, vocab) (a stream of `seed`, a pure function of the request's id
// and position; below prefix_len, of its prefix_id and position), so a
// workload of lengths can run on a model's values.
void draw_prompts(std::vector<Request>& requests, int vocab, uint64_t seed);

// A CSV trace: a header line `arrival_s,prompt_len,output_len`, then one row
// per request; arrivals must not decrease. A fourth column `prompt_tokens`
// (the header says so) gives each prompt's ids separated by spaces, as many
// as prompt_len; or two columns `prefix_id,prefix_len` say which requests
// share how many leading tokens (prefix_id -1: none; the ids would say it
// themselves, so not both). ConfigError with the line number.
std::vector<Request> load_trace(const std::string& path);

}  // namespace shardlab::serve
