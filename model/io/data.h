// Token data and batch sampling.
//
// Sizes: N tokens in the stream, B rows in the global batch, T tokens per row
// (the sequence length). A row is a window of T+1 consecutive tokens:
// x = tokens[start, start+T), y = tokens[start+1, start+T+1).
//
// The global batch of a step is a pure function of (data, B, T, sampling,
// seed, step), never of the parallel config: a DP rank asks for its rows
// [r0, r1) and gets exactly those rows of the global batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab::model {

// Tokens of a synthetic stream when the caller does not say: 1M (2 MiB).
inline constexpr int64_t kDefaultSyntheticTokens = int64_t{1} << 20;

struct TokenData {
  std::string origin;               // "synthetic:markov" or the file path
  int vocab = 0;                    // every token is < vocab
  std::vector<uint16_t> tokens;     // (N)
  std::optional<double> best_loss;  // best achievable mean CE, nats, if known
};

// nanoGPT's .bin: a flat little-endian uint16 stream. Throws ConfigError
// ("`data` ...") on a missing file, an odd byte length, fewer than seq+1
// tokens, or a token >= vocab (naming the first such position and value).
TokenData load_token_bin(const std::string& path, int vocab, int64_t seq);

// A synthetic task (see synthetic.h) by bare name, checked against vocab/seq.
TokenData make_synthetic_data(const std::string& name, int vocab, int64_t seq, uint64_t seed,
                              int64_t n_tokens = kDefaultSyntheticTokens);

// The --data flag: "synthetic:NAME" or a path to a .bin file.
TokenData open_token_data(const std::string& spec, int vocab, int64_t seq, uint64_t seed,
                          int64_t synthetic_tokens = kDefaultSyntheticTokens);

enum class Sampling { kRandom, kSequential };
// "random" | "sequential"; anything else is ConfigError("`sampling`: ...").
Sampling parse_sampling(std::string_view text);
const char* sampling_name(Sampling s);

struct Batch {
  int64_t rows = 0;        // R: rows in this batch (B, or a slice of it)
  int64_t seq = 0;         // T
  std::vector<int32_t> x;  // (R, T) input tokens
  std::vector<int32_t> y;  // (R, T) targets: x shifted by one
};

// Draws windows from a token stream.
//
//   sequential: with W = floor((N-1)/T) whole windows, row j of step s starts
//               at ((s*B + j) mod W) * T, i.e. the stream read in order,
//               wrapping around after the last whole window.
//   random:     row j of step s starts at a uniform value in [0, N-T), drawn
//               from counter_hash(seed, s, j): no state, any rank can draw any
//               row of any step.
//
// Thread safety: immutable after construction; every method may be called
// from any number of threads at once.
class BatchSampler {
 public:
  // Throws ConfigError if batch or seq is not positive, or the data is
  // shorter than one window of seq+1 tokens.
  BatchSampler(std::shared_ptr<const TokenData> data, int64_t batch, int64_t seq, Sampling sampling,
               uint64_t seed);

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  Sampling sampling() const { return sampling_; }
  const TokenData& data() const { return *data_; }

  // First token of row `row` (0 <= row < B) of step `step` (>= 0).
  int64_t window_start(int64_t step, int64_t row) const;
  // The whole global batch of a step: B rows.
  Batch next_batch(int64_t step) const { return batch_rows(step, 0, batch_); }
  // Rows [r0, r1) of the global batch of `step`; 0 <= r0 <= r1 <= B.
  Batch batch_rows(int64_t step, int64_t r0, int64_t r1) const;
  // The same into `out`, reusing its buffers (no allocation once they are big enough).
  void batch_rows(int64_t step, int64_t r0, int64_t r1, Batch& out) const;

 private:
  std::shared_ptr<const TokenData> data_;
  int64_t batch_;
  int64_t seq_;
  Sampling sampling_;
  uint64_t seed_;
};

}  // namespace shardlab::model
