// The paged KV cache of one replica, as vLLM's block manager keeps it: the
// cache is cut into fixed-size blocks of `block_tokens` tokens (every layer's
// K and V of those tokens on every device of the replica), each sequence owns
// a block table (the ids of its blocks, in token order), and a sequence grows
// one block at a time as its tokens cross a block boundary. Blocks come from
// a free list (a stack: the lowest ids first, freed blocks reused first), so a
// run is deterministic.
//
// Thread safety: one instance per replica, used by its scheduler only.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace shardlab::serve {

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
  void release(int seq);  // every block of `seq` back to the free list

  const std::vector<int32_t>& table(int seq) const;  // empty when it holds none
  int64_t total_blocks() const { return total_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return total_ - free_blocks(); }
  int block_tokens() const { return block_tokens_; }

 private:
  int64_t total_;
  int block_tokens_;
  std::vector<int32_t> free_;  // a stack: the lowest id on top
  std::unordered_map<int, std::vector<int32_t>> tables_;
};

}  // namespace shardlab::serve
