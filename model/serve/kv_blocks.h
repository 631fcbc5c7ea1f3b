// The paged KV cache of one replica, as vLLM's block manager keeps it: the
// cache is cut into fixed-size blocks of `block_tokens` tokens (every layer's
// K and V of those tokens on every device of the replica), each sequence owns
// a block table (the ids of its blocks, in token order), and a sequence grows
// one block at a time as its tokens cross a block boundary. Blocks come from
// a free list (the lowest ids first, freed blocks reused first), so a run is
// deterministic.
//
// Prefix caching (vLLM's automatic prefix caching): a full block of a prompt
// can be named by a hash of its content — its tokens and its parent block's
// hash (block_hashes), so equal names mean equal prefixes. A named block is
// shared by every sequence whose prompt starts with it (a reference count),
// and when the last one lets go it stays in the cache, evictable: the free
// list keeps unnamed blocks first and named ones after them in the order
// they were freed (a sequence's later blocks before its earlier ones, as
// vLLM frees them), so a new block is taken from an unnamed block, or else
// evicts the least recently used named one (only blocks no sequence holds).
//
// Thread safety: one instance per replica, used by its scheduler only.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace shardlab::serve {

// The names of a sequence's full blocks: block i's hash covers its
// `block` content keys and block i-1's hash (a chain, as vLLM hashes).
std::vector<uint64_t> block_hashes(std::span<const uint64_t> keys, int block);
// The name of the block of content `keys` after the block named `parent` (0: the first).
uint64_t chain_hash(uint64_t parent, std::span<const uint64_t> keys);

class KvBlocks {
 public:
  KvBlocks(int64_t blocks, int block_tokens);

  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }
  // Blocks sequence `seq` would need to hold `tokens` tokens in all.
  int64_t missing(int seq, int64_t tokens) const;
  bool can_hold(int seq, int64_t tokens) const { return missing(seq, tokens) <= free_blocks(); }
  // Grows `seq`'s table to hold `tokens` tokens; false (and no change) when
  // the free blocks do not suffice.
  bool grow(int seq, int64_t tokens);
  void release(int seq);  // every block of `seq` let go of (a named one stays cached)

  // Prefix caching. How many leading `hashes` name blocks in the cache.
  int64_t cached_prefix(std::span<const uint64_t> hashes) const;
  // A new sequence (no table) sharing the blocks named by the first `hit`
  // hashes, grown to hold `tokens`; false (and no change) when the free
  // blocks do not suffice.
  bool grow_shared(int seq, std::span<const uint64_t> hashes, int64_t hit, int64_t tokens);
  // Names block `index` of `seq`'s table `hash` (its tokens are computed);
  // false when the block has a name or another block has this one.
  bool name(int seq, int64_t index, uint64_t hash);
  // The named blocks reused for new content since the last call.
  std::vector<int32_t> take_evicted();

  const std::vector<int32_t>& table(int seq) const;  // empty when it holds none
  int64_t total_blocks() const { return total_; }
  int64_t free_blocks() const { return free_count_; }
  int64_t used_blocks() const { return total_ - free_blocks(); }
  int block_tokens() const { return block_tokens_; }

 private:
  struct Block {
    int32_t refs = 0;
    bool named = false;
    uint8_t list = 0;  // the free list's part it is in: 0 none, 1 front_, 2 back_
    uint64_t hash = 0;
    int32_t prev = -1, next = -1;  // in that part
  };
  struct List {
    int32_t head = -1, tail = -1;
  };
  void unlink(int32_t b);
  void link(int32_t b, bool front);  // into the free list, at its head or its tail
  int32_t take();  // the free list's first block, its name dropped

  int64_t total_;
  int block_tokens_;
  // The free list (unnamed blocks, then named ones oldest first) is front_,
  // then the blocks never used (fresh_ to total_, in id order), then back_:
  // a block freed to the front joins front_, to the end back_. The blocks
  // never used need no entry: a cache of millions of blocks (a small model
  // on an 80 GB device) costs nothing until its blocks are taken, where
  // linking them all took a serving run's first 100+ ms.
  std::vector<Block> blocks_;  // blocks [0, fresh_)
  List front_, back_;
  int64_t fresh_ = 0;
  int64_t free_count_ = 0;
  std::unordered_map<uint64_t, int32_t> named_;
  std::vector<int32_t> evicted_;
  std::unordered_map<int, std::vector<int32_t>> tables_;
};

}  // namespace shardlab::serve
