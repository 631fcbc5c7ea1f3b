#include "model/infer/kv_cache.h"

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::infer {

KvCache::KvCache(Device& dev, KvShape shape)
    : dev_(dev), shape_(shape), elem_(shape.elem > 0 ? shape.elem : element_size(dev.precision())) {}

KvCache::~KvCache() {
  if (tokens_ > 0) dev_.arena().release(bytes(), MemKind::kKvCache);
}

uint64_t KvCache::bytes_for(const KvShape& s, int64_t tokens, int element_bytes) {
  return uint64_t(s.planes) * uint64_t(s.layers) * uint64_t(s.row()) * uint64_t(tokens) * uint64_t(element_bytes);
}

const KvCache::Entry& KvCache::entry(int seq) const {
  SHARDLAB_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].length >= 0,
                 fmt::format("KV cache: no sequence {}", seq));
  return seqs_[size_t(seq)];
}

int KvCache::add_sequence(int max_tokens) {
  SHARDLAB_CHECK(max_tokens > 0, "KV cache: a sequence needs room for a token");
  Entry e;
  e.length = 0;
  e.max_tokens = max_tokens;
  e.data.assign(size_t(int64_t{shape_.layers} * max_tokens * shape_.token_elements()), 0.0f);
  seqs_.push_back(std::move(e));
  return int(seqs_.size()) - 1;
}

void KvCache::release(int seq) {
  Entry& e = entry(seq);
  dev_.arena().release(bytes_for(shape_, e.length - e.shared, elem_), MemKind::kKvCache);
  tokens_ -= e.length - e.shared;
  e = Entry{};
}

int KvCache::append(int seq, int n) {
  Entry& e = entry(seq);
  SHARDLAB_CHECK(n >= 0 && e.length + n <= e.max_tokens,
                 fmt::format("KV cache: sequence {} holds {} of {} tokens, {} more do not fit", seq,
                             e.length, e.max_tokens, n));
  dev_.arena().allocate(bytes_for(shape_, n, elem_), MemKind::kKvCache, "kv cache");
  const int first = e.length;
  e.length += n;
  tokens_ += n;
  return first;
}

int KvCache::adopt(int seq, int n) {
  Entry& e = entry(seq);
  SHARDLAB_CHECK(n >= 0 && e.length + n <= e.max_tokens,
                 fmt::format("KV cache: sequence {} holds {} of {} tokens, {} shared do not fit", seq, e.length,
                             e.max_tokens, n));
  const int first = e.length;
  e.length += n;
  e.shared += n;
  return first;
}

void KvCache::truncate(int seq, int n) {
  Entry& e = entry(seq);
  SHARDLAB_CHECK(n >= e.shared && n <= e.length,
                 fmt::format("KV cache: sequence {} of {} tokens ({} shared) cannot keep {}", seq, e.length, e.shared, n));
  dev_.arena().release(bytes_for(shape_, e.length - n, elem_), MemKind::kKvCache);
  tokens_ -= e.length - n;
  e.length = n;
}

float* KvCache::plane(int seq, int local_layer, int k) {
  SHARDLAB_CHECK(k >= 0 && k < shape_.planes, fmt::format("KV cache: no plane {} of {}", k, shape_.planes));
  Entry& e = entry(seq);
  if (e.data.phantom()) return nullptr;
  return e.data.data() + (int64_t{shape_.planes} * local_layer + k) * e.max_tokens * shape_.row();
}

}  // namespace shardlab::infer
