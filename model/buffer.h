// Buffer<T>: a contiguous host buffer, 64-byte aligned, that can be phantom.
//
// Alignment. Eigen's vectorised kernels peel unaligned heads, so their
// summation order (and the last bits of the result) depends on where a
// buffer starts. With every host buffer 64-byte aligned (as runtime tensors
// are) results depend only on the data and the offsets inside a buffer,
// never on heap layout: two runs give bit-identical numbers whatever the
// allocation history.
//
// Phantom. A floating-point Buffer sized while a PhantomScope is active on
// the calling thread keeps its size and no storage: data(), begin() and
// end() are null, so the code that sizes buffers, charges their elements to
// an arena and passes them to collectives runs unchanged, while the math on
// them is skipped (model::Exec::phantom). This is PyTorch's meta device: the
// same program on shapes only. Integer buffers (tokens, routing plans,
// counts) always have storage: they are small and their values steer the
// program. assign_real() gives a floating-point buffer storage anyway (the
// per-expert counts that travel through collectives).
//
// Thread safety: a Buffer is used by one thread; the scope is per thread
// (each virtual device is one thread).
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
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

// p + offset, or null for a phantom buffer's null data: a slice of a
// phantom buffer is phantom (collectives take a null pointer as "phantom").
template <typename T, typename I>
T* shifted(T* p, I offset) {
  return p ? p + offset : nullptr;
}

// Whether buffers sized on this thread now are phantom.
bool phantom_allocation();

// Makes floating-point buffers sized on this thread phantom while it lives.
class PhantomScope {
 public:
  explicit PhantomScope(bool on = true);
  ~PhantomScope();
  PhantomScope(const PhantomScope&) = delete;
  PhantomScope& operator=(const PhantomScope&) = delete;

 private:
  bool previous_;
};

template <typename T>
class Buffer {
 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  Buffer() = default;
  explicit Buffer(std::size_t n, T v = T()) { assign(n, v); }

  // Sizes the buffer to n elements of value v (phantom: size only).
  void assign(std::size_t n, T v) {
    if (can_be_phantom && phantom_allocation()) {
      v_.clear();
      v_.shrink_to_fit();
      size_ = n;
      phantom_ = true;
      return;
    }
    assign_real(n, v);
  }
  void assign_real(std::size_t n, T v) {
    v_.assign(n, v);
    size_ = n;
    phantom_ = false;
  }
  void resize(std::size_t n) {
    if (phantom_ || (can_be_phantom && size_ == 0 && phantom_allocation())) {
      assign(n, T());
      return;
    }
    v_.resize(n);
    size_ = n;
  }
  // A copy of [first, last) (always real: the model copies tokens this way).
  template <typename It>
    requires(!std::is_integral_v<It>)
  void assign(It first, It last) {
    v_.assign(first, last);
    size_ = v_.size();
    phantom_ = false;
  }
  void clear() { assign_real(0, T()); }

  bool phantom() const { return phantom_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return phantom_ ? nullptr : v_.data(); }
  const T* data() const { return phantom_ ? nullptr : v_.data(); }
  T* begin() { return data(); }
  T* end() { return phantom_ ? nullptr : v_.data() + v_.size(); }
  const T* begin() const { return data(); }
  const T* end() const { return phantom_ ? nullptr : v_.data() + v_.size(); }
  T& operator[](std::size_t i) { return v_[i]; }
  const T& operator[](std::size_t i) const { return v_[i]; }

 private:
  static constexpr bool can_be_phantom = std::is_floating_point_v<T>;
  std::vector<T, AlignedAllocator<T>> v_;
  std::size_t size_ = 0;
  bool phantom_ = false;
};

}  // namespace shardlab::model
