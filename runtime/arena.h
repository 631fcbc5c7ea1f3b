// Arena: the modeled memory of one virtual device.
//
// Accounts modeled bytes (elements x modeled element size), by kind, with
// current and peak use, against the profile's capacity. Host storage is
// separate (a phantom tensor is accounted but has none).
//
// Thread safety: an arena belongs to one device and is used only by that
// device's thread (ownership invariant); it takes no locks. Readers on other
// threads (reports) look only after the run has joined.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace shardlab {

// kOptimizer: AdamW's moments; kMaster: the fp32 master weights of a bf16 model;
// kKvCache: inference's cached keys and values (model/infer/kv_cache.h).
enum class MemKind : uint8_t { kParam, kGrad, kOptimizer, kMaster, kActivation, kComm, kOther, kKvCache };
inline constexpr int kNumMemKinds = 8;
const char* mem_kind_name(MemKind k);  // "param", "grad", ...

class Arena {
 public:
  Arena(int device, uint64_t capacity_bytes) : device_(device), capacity_(capacity_bytes) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Throws OutOfMemory naming the device, `what`, the request and the free bytes.
  void allocate(uint64_t bytes, MemKind kind, std::string_view what);
  void release(uint64_t bytes, MemKind kind);

  int device() const { return device_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t peak() const { return peak_; }
  uint64_t free_bytes() const { return capacity_ - used_; }
  uint64_t used(MemKind k) const { return used_by_kind_[static_cast<int>(k)]; }
  uint64_t peak(MemKind k) const { return peak_by_kind_[static_cast<int>(k)]; }
  void reset_peak();

 private:
  int device_;
  uint64_t capacity_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
  std::array<uint64_t, kNumMemKinds> used_by_kind_{};
  std::array<uint64_t, kNumMemKinds> peak_by_kind_{};
};

}  // namespace shardlab
