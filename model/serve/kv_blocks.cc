#include "model/serve/kv_blocks.h"

#include "runtime/errors.h"

namespace shardlab::serve {

KvBlocks::KvBlocks(int64_t blocks, int block_tokens) : total_(blocks), block_tokens_(block_tokens) {
  SHARDLAB_CHECK(blocks >= 0 && blocks < (int64_t(1) << 31), "KV block count out of range");
  SHARDLAB_CHECK(block_tokens > 0, "KV block size must be positive");
  free_.reserve(static_cast<size_t>(blocks));
  for (int64_t b = blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t KvBlocks::missing(int seq, int64_t tokens) const {
  const auto it = tables_.find(seq);
  const int64_t held = it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
  return std::max<int64_t>(blocks_for(tokens) - held, 0);
}

bool KvBlocks::grow(int seq, int64_t tokens) {
  const int64_t need = missing(seq, tokens);
  if (need > free_blocks()) return false;
  std::vector<int32_t>& t = tables_[seq];
  for (int64_t i = 0; i < need; ++i) {
    t.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvBlocks::release(int seq) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) free_.push_back(*b);
  tables_.erase(it);
}

const std::vector<int32_t>& KvBlocks::table(int seq) const {
  static const std::vector<int32_t> kNone;
  const auto it = tables_.find(seq);
  return it == tables_.end() ? kNone : it->second;
}

}  // namespace shardlab::serve
