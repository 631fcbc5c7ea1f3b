// The token-file reader (model/io/data.h): load_token_bin, as --data FILE.bin
// uses it, then the batch sampler over what it read. The first 4 bytes of
// the input choose the parameters, the rest is the file:
//   bytes 0-1  vocab (uint16 little-endian; 0 tests the vocab check)
//   byte  2    seq (0-255; 0 tests the seq check)
//   byte  3    batch (low 4 bits, 0-15; 0 tests the batch check), sampling
//              (bit 7: sequential) and the seed (the whole byte)
#include <algorithm>
#include <memory>

#include "fuzz/fuzz_util.h"
#include "model/io/data.h"
#include "runtime/errors.h"

namespace {

using shardlab::fuzz::finding;
using shardlab::model::TokenData;

// An accepted file holds exactly its tokens, each below vocab.
void check_tokens(const TokenData& d, size_t file_bytes, int vocab) {
  if (d.tokens.size() * 2 != file_bytes) finding("token count differs from the file size / 2");
  if (std::any_of(d.tokens.begin(), d.tokens.end(), [&](uint16_t t) { return t >= vocab; }))
    finding("a token >= vocab was accepted");
}

// Every row the sampler draws is a window of seq+1 tokens inside the stream.
void check_batches(const shardlab::model::BatchSampler& sampler, const TokenData& d) {
  const int64_t seq = sampler.seq();
  for (int64_t step = 0; step < 3; ++step) {
    const shardlab::model::Batch b = sampler.next_batch(step);
    for (int64_t r = 0; r < b.rows; ++r) {
      const int64_t start = sampler.window_start(step, r);
      if (start < 0 || start + seq + 1 > static_cast<int64_t>(d.tokens.size()))
        finding("a sampled window runs outside the token stream");
      for (int64_t t = 0; t < seq; ++t)
        if (b.x[size_t(r * seq + t)] != d.tokens[size_t(start + t)] ||
            b.y[size_t(r * seq + t)] != d.tokens[size_t(start + t + 1)])
          finding("a batch row is not its window of the stream");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static shardlab::fuzz::MemFile file;
  if (size < 4) return 0;
  const int vocab = data[0] | data[1] << 8;
  const int64_t seq = data[2];
  const int batch = data[3] & 0x0f;
  const auto sampling = (data[3] & 0x80) ? shardlab::model::Sampling::kSequential
                                         : shardlab::model::Sampling::kRandom;
  try {
    auto d = std::make_shared<const TokenData>(
        shardlab::model::load_token_bin(file.write(data + 4, size - 4), vocab, seq));
    check_tokens(*d, size - 4, vocab);
    const shardlab::model::BatchSampler sampler(d, batch, seq, sampling, /*seed=*/data[3]);
    check_batches(sampler, *d);
  } catch (const shardlab::ConfigError&) {
    // A bad file or bad sizes: the expected outcome, one line naming the problem.
  }
  return 0;
}
