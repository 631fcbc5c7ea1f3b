// Tensor: a shaped buffer owned by one device's arena.
//
// The arena is charged numel x modeled element size (4 for fp32, 2 for bf16)
// while the tensor lives. Host storage is always fp32, 64-byte aligned and
// zero-initialised, or absent for a "phantom" tensor (shape only: ops on it
// charge cost but compute nothing). Move-only; freeing returns the bytes. Owner thread only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/arena.h"
#include "runtime/cost_model.h"

namespace shardlab {

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& s);  // "[4, 128]"
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  // Allocates in `arena`; throws OutOfMemory.
  Tensor(Arena& arena, std::string name, Shape shape, MemKind kind, Precision precision,
         bool phantom = false);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor();

  bool defined() const { return arena_ != nullptr; }
  bool phantom() const { return defined() && !data_; }
  const std::string& name() const { return name_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t numel() const { return numel_; }
  MemKind kind() const { return kind_; }
  int element_size() const { return element_size_; }
  uint64_t modeled_bytes() const { return static_cast<uint64_t>(numel_) * element_size_; }
  int device() const { return arena_ ? arena_->device() : -1; }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  std::span<float> span() { return {data_.get(), data_ ? static_cast<size_t>(numel_) : 0}; }
  std::span<const float> span() const { return {data_.get(), data_ ? static_cast<size_t>(numel_) : 0}; }

 private:
  struct FreeAligned {
    void operator()(float* p) const;
  };
  void reset();

  Arena* arena_ = nullptr;
  std::string name_;
  Shape shape_;
  int64_t numel_ = 0;
  MemKind kind_ = MemKind::kOther;
  int element_size_ = 4;
  std::unique_ptr<float[], FreeAligned> data_;
};

}  // namespace shardlab
