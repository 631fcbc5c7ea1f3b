#include "model/serve/kv_blocks.h"

#include <algorithm>
#include <utility>

#include "model/rng.h"
#include "runtime/errors.h"

namespace shardlab::serve {

std::vector<uint64_t> block_hashes(std::span<const uint64_t> keys, int block) {
  SHARDLAB_CHECK(block > 0, "KV block size must be positive");
  // A 64-bit chain (vLLM uses SHA-256 or Python's hash): a collision would
  // share a wrong block, at odds of about n² / 2^65 for n blocks.
  std::vector<uint64_t> out;
  for (size_t b = 0; (b + 1) * size_t(block) <= keys.size(); ++b)
    out.push_back(chain_hash(out.empty() ? 0 : out.back(), keys.subspan(b * size_t(block), size_t(block))));
  return out;
}

uint64_t chain_hash(uint64_t parent, std::span<const uint64_t> keys) {
  static const uint64_t key = model::stream_key(0, "serve.block_hash");
  uint64_t h = parent;
  for (const uint64_t k : keys) h = model::random_bits(key, h ^ k);
  return h;
}

KvBlocks::KvBlocks(int64_t blocks, int block_tokens)
    : total_(blocks), block_tokens_(block_tokens), free_count_(blocks) {
  SHARDLAB_CHECK(blocks >= 0 && blocks < (int64_t(1) << 31), "KV block count out of range");
  SHARDLAB_CHECK(block_tokens > 0, "KV block size must be positive");
}

void KvBlocks::unlink(int32_t b) {
  Block& k = blocks_[size_t(b)];
  List& l = k.list == 1 ? front_ : back_;
  (k.prev < 0 ? l.head : blocks_[size_t(k.prev)].next) = k.next;
  (k.next < 0 ? l.tail : blocks_[size_t(k.next)].prev) = k.prev;
  k.prev = k.next = -1;
  k.list = 0;
  --free_count_;
}

// Into the free list, first (front_'s head) or last (back_'s tail).
void KvBlocks::link(int32_t b, bool front) {
  Block& k = blocks_[size_t(b)];
  List& l = front ? front_ : back_;
  int32_t& end = front ? l.head : l.tail;  // the end it joins
  (front ? k.prev : k.next) = -1;
  (front ? k.next : k.prev) = end;
  int32_t& other = end < 0 ? (front ? l.tail : l.head) : (front ? blocks_[size_t(end)].prev : blocks_[size_t(end)].next);
  other = b;
  end = b;
  k.list = front ? 1 : 2;
  ++free_count_;
}

int32_t KvBlocks::take() {
  int32_t b;
  if (front_.head >= 0) {
    b = front_.head;
    unlink(b);
  } else if (fresh_ < total_) {  // the lowest block never used
    b = int32_t(fresh_++);
    blocks_.emplace_back();
    --free_count_;
  } else {
    b = back_.head;
    unlink(b);
  }
  Block& k = blocks_[size_t(b)];
  if (k.named) {  // the least recently used cached block: evicted
    named_.erase(k.hash);
    k.named = false;
    evicted_.push_back(b);
  }
  k.refs = 1;
  return b;
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
  for (int64_t i = 0; i < need; ++i) t.push_back(take());
  return true;
}

void KvBlocks::release(int seq) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  // Last block first: an unnamed one ends on top (the first block reused
  // first), a named one is evicted before the blocks it follows.
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
    Block& k = blocks_[size_t(*b)];
    if (--k.refs > 0) continue;
    link(*b, !k.named);
  }
  tables_.erase(it);
}

int64_t KvBlocks::cached_prefix(std::span<const uint64_t> hashes) const {
  int64_t n = 0;
  while (size_t(n) < hashes.size() && named_.contains(hashes[size_t(n)])) ++n;
  return n;
}

bool KvBlocks::grow_shared(int seq, std::span<const uint64_t> hashes, int64_t hit, int64_t tokens) {
  SHARDLAB_CHECK(!tables_.contains(seq) && hit <= cached_prefix(hashes), "KV blocks: a shared prefix out of order");
  int64_t idle = 0;  // hit blocks no sequence holds: they leave the free list
  for (int64_t i = 0; i < hit; ++i) idle += blocks_[size_t(named_.at(hashes[size_t(i)]))].refs == 0 ? 1 : 0;
  if (std::max<int64_t>(blocks_for(tokens) - hit, 0) + idle > free_blocks()) return false;
  std::vector<int32_t>& t = tables_[seq];
  for (int64_t i = 0; i < hit; ++i) {
    const int32_t b = named_.at(hashes[size_t(i)]);
    if (blocks_[size_t(b)].refs++ == 0) unlink(b);
    t.push_back(b);
  }
  return grow(seq, tokens);
}

bool KvBlocks::name(int seq, int64_t index, uint64_t hash) {
  const std::vector<int32_t>& t = table(seq);
  SHARDLAB_CHECK(index >= 0 && size_t(index) < t.size(), "KV blocks: naming a block the sequence does not hold");
  Block& k = blocks_[size_t(t[size_t(index)])];
  if (k.named || named_.contains(hash)) return false;
  k.named = true;
  k.hash = hash;
  named_.emplace(hash, t[size_t(index)]);
  return true;
}

std::vector<int32_t> KvBlocks::take_evicted() { return std::exchange(evicted_, {}); }

const std::vector<int32_t>& KvBlocks::table(int seq) const {
  static const std::vector<int32_t> kNone;
  const auto it = tables_.find(seq);
  return it == tables_.end() ? kNone : it->second;
}

}  // namespace shardlab::serve
