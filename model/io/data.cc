#include "model/io/data.h"

#include <fmt/format.h>

#include <fstream>

#include "model/io/synthetic.h"
#include "model/io/token_rng.h"
#include "runtime/errors.h"
#include "runtime/input_file.h"

namespace shardlab::model {
namespace {

constexpr std::string_view kSyntheticPrefix = "synthetic:";

void check_sizes(int vocab, int64_t seq) {
  if (vocab < 1) throw ConfigError(fmt::format("`vocab_size` must be positive (got {})", vocab));
  if (seq < 1) throw ConfigError(fmt::format("`block_size` must be positive (got {})", seq));
}

[[noreturn]] void too_short(const std::string& origin, int64_t n, int64_t seq) {
  throw ConfigError(
      fmt::format("`data` \"{}\": {} tokens, too short for one window of seq+1 = {} "
                  "tokens",
                  origin, n, seq + 1));
}

}  // namespace

TokenData load_token_bin(const std::string& path, int vocab, int64_t seq) {
  check_sizes(vocab, seq);
  // A typo of synthetic:NAME looks like a missing path.
  std::ifstream in = open_input(fmt::format("`data` \"{}\"", path), path, "a .bin file",
                                " (expected synthetic:NAME or a .bin file)");
  in.seekg(0, std::ios::end);
  const std::streamoff bytes = in.tellg();
  in.seekg(0, std::ios::beg);
  if (bytes < 0) throw ConfigError(fmt::format("`data` \"{}\": cannot read", path));
  if (bytes % 2 != 0)
    throw ConfigError(
        fmt::format("`data` \"{}\": odd length ({} bytes); a .bin file is a stream "
                    "of uint16 tokens",
                    path, bytes));
  const int64_t n = bytes / 2;
  if (n < seq + 1) too_short(path, n, seq);

  TokenData data{path, vocab, std::vector<uint16_t>(static_cast<size_t>(n)), std::nullopt};
  std::vector<uint8_t> raw(static_cast<size_t>(bytes));
  in.read(reinterpret_cast<char*>(raw.data()), bytes);
  if (in.gcount() != bytes) throw ConfigError(fmt::format("`data` \"{}\": read failed", path));
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t t = static_cast<uint16_t>(raw[size_t(2 * i)] | raw[size_t(2 * i + 1)] << 8);
    if (t >= vocab)
      throw ConfigError(
          fmt::format("`data` \"{}\": token {} at position {} is >= vocab {} "
                      "(set `vocab_size` above the largest token)",
                      path, t, i, vocab));
    data.tokens[size_t(i)] = t;
  }
  return data;
}

TokenData make_synthetic_data(const std::string& name, int vocab, int64_t seq, uint64_t seed,
                              int64_t n_tokens) {
  check_sizes(vocab, seq);
  const SyntheticTask& task = find_synthetic_task(name);
  const std::string origin = fmt::format("synthetic:{}", name);
  if (vocab < task.min_vocab || vocab > 65536)
    throw ConfigError(fmt::format("`vocab_size` {} does not suit {} (needs {} to 65536)", vocab, origin,
                                  task.min_vocab));
  if (n_tokens < seq + 1) too_short(origin, n_tokens, seq);
  return TokenData{origin, vocab, task.generate(vocab, n_tokens, seed), task.best_loss(vocab)};
}

TokenData open_token_data(const std::string& spec, int vocab, int64_t seq, uint64_t seed,
                          int64_t synthetic_tokens) {
  if (spec.starts_with(kSyntheticPrefix))
    return make_synthetic_data(spec.substr(kSyntheticPrefix.size()), vocab, seq, seed,
                               synthetic_tokens);
  return load_token_bin(spec, vocab, seq);
}

Sampling parse_sampling(std::string_view text) {
  if (text == "random") return Sampling::kRandom;
  if (text == "sequential") return Sampling::kSequential;
  throw ConfigError(fmt::format("`sampling`: unknown value \"{}\" (random or sequential)", text));
}

const char* sampling_name(Sampling s) { return s == Sampling::kRandom ? "random" : "sequential"; }

BatchSampler::BatchSampler(std::shared_ptr<const TokenData> data, int64_t batch, int64_t seq,
                           Sampling sampling, uint64_t seed)
    : data_(std::move(data)), batch_(batch), seq_(seq), sampling_(sampling), seed_(seed) {
  SHARDLAB_CHECK(data_ != nullptr, "BatchSampler needs data");
  if (batch_ < 1) throw ConfigError(fmt::format("`batch_size` must be positive (got {})", batch_));
  if (seq_ < 1) throw ConfigError(fmt::format("`block_size` must be positive (got {})", seq_));
  const int64_t n = static_cast<int64_t>(data_->tokens.size());
  if (n < seq_ + 1) too_short(data_->origin, n, seq_);
}

int64_t BatchSampler::window_start(int64_t step, int64_t row) const {
  SHARDLAB_CHECK(step >= 0 && row >= 0 && row < batch_,
                 fmt::format("window_start(step {}, row {}) with batch {}", step, row, batch_));
  const uint64_t n = data_->tokens.size();
  if (sampling_ == Sampling::kSequential) {
    const uint64_t windows = (n - 1) / uint64_t(seq_);  // W >= 1: n >= seq + 1
    const uint128_t index = static_cast<uint128_t>(step) * uint64_t(batch_) + uint64_t(row);
    return static_cast<int64_t>(static_cast<uint64_t>(index % windows) * uint64_t(seq_));
  }
  const uint64_t starts = n - uint64_t(seq_);  // valid starts: [0, n - T)
  return static_cast<int64_t>(scale_to(counter_hash(seed_, uint64_t(step), uint64_t(row)), starts));
}

Batch BatchSampler::batch_rows(int64_t step, int64_t r0, int64_t r1) const {
  Batch b;
  batch_rows(step, r0, r1, b);
  return b;
}

void BatchSampler::batch_rows(int64_t step, int64_t r0, int64_t r1, Batch& b) const {
  SHARDLAB_CHECK(0 <= r0 && r0 <= r1 && r1 <= batch_,
                 fmt::format("batch_rows [{}, {}) outside batch {}", r0, r1, batch_));
  b.rows = r1 - r0;
  b.seq = seq_;
  b.x.resize(size_t(b.rows * seq_));
  b.y.resize(size_t(b.rows * seq_));
  const uint16_t* tokens = data_->tokens.data();
  for (int64_t r = 0; r < b.rows; ++r) {
    const uint16_t* w = tokens + window_start(step, r0 + r);
    int32_t* x = &b.x[size_t(r * seq_)];
    int32_t* y = &b.y[size_t(r * seq_)];
    for (int64_t t = 0; t < seq_; ++t) {
      x[t] = w[t];
      y[t] = w[t + 1];
    }
  }
}

}  // namespace shardlab::model
