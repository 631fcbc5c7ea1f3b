// Buffer<T>: a std::vector whose storage is 64-byte aligned.
//
// Eigen's vectorised kernels peel unaligned heads, so their summation order
// (and the last bits of the result) depends on where a buffer starts. With
// every host buffer 64-byte aligned (as runtime tensors are) results depend
// only on the data and the offsets inside a buffer, never on heap layout:
// two runs give bit-identical numbers whatever the allocation history.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace shardlab::model {

inline constexpr std::size_t kBufferAlignment = 64;

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kBufferAlignment}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{kBufferAlignment});
  }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using Buffer = std::vector<T, AlignedAllocator<T>>;

}  // namespace shardlab::model
