#include "runtime/arena.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/units.h"

namespace shardlab {

const char* mem_kind_name(MemKind k) {
  static const char* kNames[kNumMemKinds] = {"param", "grad", "optimizer", "master", "activation", "comm", "other",
                                             "kv_cache"};
  return kNames[static_cast<int>(k)];
}

void Arena::allocate(uint64_t bytes, MemKind kind, std::string_view what) {
  if (bytes > capacity_ - used_) {
    throw OutOfMemory(fmt::format(
        "device {}: out of memory allocating '{}' ({} bytes, {}): {} free of {} capacity ({} bytes free)",
        device_, what, bytes, format_bytes(bytes), format_bytes(free_bytes()), format_bytes(capacity_),
        free_bytes()));
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  auto k = static_cast<int>(kind);
  used_by_kind_[k] += bytes;
  peak_by_kind_[k] = std::max(peak_by_kind_[k], used_by_kind_[k]);
}

void Arena::release(uint64_t bytes, MemKind kind) {
  auto k = static_cast<int>(kind);
  SHARDLAB_CHECK(bytes <= used_ && bytes <= used_by_kind_[k], "arena release exceeds use");
  used_ -= bytes;
  used_by_kind_[k] -= bytes;
}

void Arena::reset_peak() {
  peak_ = used_;
  peak_by_kind_ = used_by_kind_;
}

}  // namespace shardlab
