// KvCache: the keys and values one device keeps for the sequences it serves.
//
// Layout (Cl = heads·HS: this rank's K/V heads times the head size; NHl for
// multi-head attention, KV/tp under GQA, all KV heads when tp does not
// divide them): for every sequence and every local layer (a pipeline
// stage's blocks, in order), K then V, each (max_tokens, Cl), token-major:
// token t of layer l is the row [k | v](l, t) of the layer's c_attn output
// for the K/V heads this tensor-parallel rank holds. Host storage is reserved for max_tokens per sequence when it is
// added (none under a PhantomScope); the arena is charged only for the tokens
// held, as MemKind::kKvCache, so its modeled bytes are always exactly
//
//   2 · local_layers · heads · HS · tokens · element_bytes
//
// (bytes_for). Multi-head latent attention (GPTConfig::is_mla) keeps one
// plane instead of K and V: each token's normalized k/v latent and its
// rotated key, [c_kv (Lkv) | k_pe (Dr)], shared by every head and whole on
// every tensor-parallel rank (heads 1, head_dim Lkv + Dr, planes 1), so
//
//   local_layers · (Lkv + Dr) · tokens · element_bytes
//
// A paged cache (fixed-size blocks, a block table per sequence)
// can replace the per-sequence reservation behind the same calls.
//
// Thread safety: one cache per device thread.
#pragma once

#include <cstdint>
#include <vector>

#include "model/buffer.h"
#include "runtime/device.h"

namespace shardlab::infer {

struct KvShape {
  int layers = 0;    // local layers (this pipeline stage's blocks)
  int heads = 0;     // local K/V heads: NHl = n_head / tp, or GQA's KV / tp (KV when tp does not divide it)
  int head_dim = 0;  // HS
  int planes = 2;    // K and V; 1: MLA's latent rows
  int elem = 0;      // bytes a cached element; 0: the device's precision's (an FP8 cache: 1)
  int64_t row() const { return int64_t{heads} * head_dim; }  // Cl
  int64_t token_elements() const { return planes * row(); }  // every plane's row of one token and layer
};

class KvCache {
 public:
  KvCache(Device& dev, KvShape shape);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // A new empty sequence that may grow to max_tokens; returns its id.
  int add_sequence(int max_tokens);
  // Drops the sequence and returns its bytes to the arena.
  void release(int seq);
  // Makes room for n more tokens of `seq` (charged to the arena, which may
  // throw OutOfMemory); returns the position of the first.
  int append(int seq, int n);
  // Makes room for n more tokens of `seq` whose rows are shared with other
  // sequences (a serving prefix cache's blocks): charged to nobody here,
  // since the sequence that computed them was. Returns the first position.
  int adopt(int seq, int n);
  // Keeps the first n tokens of `seq` (a speculative step's rejected
  // tokens dropped), giving the bytes of the rest back.
  void truncate(int seq, int n);

  int length(int seq) const { return entry(seq).length; }
  int capacity(int seq) const { return entry(seq).max_tokens; }
  // (max_tokens, Cl) rows of `local_layer`'s plane `k` (0: K or MLA's
  // latents, 1: V); null in a phantom run.
  float* plane(int seq, int local_layer, int k);
  float* keys(int seq, int local_layer) { return plane(seq, local_layer, 0); }
  float* values(int seq, int local_layer) { return plane(seq, local_layer, 1); }
  const KvShape& shape() const { return shape_; }
  int64_t tokens() const { return tokens_; }  // charged, over all sequences (adopted ones not)
  uint64_t bytes() const { return bytes_for(shape_, tokens_, elem_); }
  int element_bytes() const { return elem_; }  // a cached element's (KvShape::elem, or the device's)
  static uint64_t bytes_for(const KvShape& s, int64_t tokens, int element_bytes);

 private:
  struct Entry {
    int length = -1;  // -1: released
    int max_tokens = 0;
    int shared = 0;  // adopted tokens, not charged
    model::Buffer<float> data;  // (layers, planes, max_tokens, Cl)
  };
  const Entry& entry(int seq) const;
  Entry& entry(int seq) { return const_cast<Entry&>(static_cast<const KvCache*>(this)->entry(seq)); }

  Device& dev_;
  KvShape shape_;
  int elem_;
  std::vector<Entry> seqs_;
  int64_t tokens_ = 0;
};

}  // namespace shardlab::infer
