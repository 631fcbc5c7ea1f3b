#include "runtime/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/errors.h"

namespace shardlab {

std::string shape_string(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {  // the caller's shape (a C++ API program's): an exception, not an abort
    if (d < 0) throw std::invalid_argument("shape " + shape_string(s) + ": negative dimension");
    if (d > 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw std::bad_array_new_length();  // past 2^63 elements: sizes no host holds (kHostOutOfMemory)
    n *= d;
  }
  return n;
}

void Tensor::FreeAligned::operator()(float* p) const { std::free(p); }

Tensor::Tensor(Arena& arena, std::string name, Shape shape, MemKind kind, Precision precision,
               bool phantom)
    : name_(std::move(name)),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)),
      kind_(kind),
      element_size_(shardlab::element_size(precision)) {
  arena.allocate(modeled_bytes(), kind_, name_);
  arena_ = &arena;
  if (!phantom) {
    size_t bytes = static_cast<size_t>(numel_) * sizeof(float);
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) {
      arena.release(modeled_bytes(), kind_);
      throw std::bad_alloc();
    }
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    data_.reset(static_cast<float*>(p));
  }
}

Tensor::Tensor(Tensor&& o) noexcept
    : arena_(o.arena_),
      name_(std::move(o.name_)),
      shape_(std::move(o.shape_)),
      numel_(o.numel_),
      kind_(o.kind_),
      element_size_(o.element_size_),
      data_(std::move(o.data_)) {
  o.arena_ = nullptr;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    reset();
    arena_ = o.arena_;
    name_ = std::move(o.name_);
    shape_ = std::move(o.shape_);
    numel_ = o.numel_;
    kind_ = o.kind_;
    element_size_ = o.element_size_;
    data_ = std::move(o.data_);
    o.arena_ = nullptr;
  }
  return *this;
}

Tensor::~Tensor() { reset(); }

void Tensor::reset() {
  if (arena_) arena_->release(modeled_bytes(), kind_);
  arena_ = nullptr;
  data_.reset();
}

}  // namespace shardlab
