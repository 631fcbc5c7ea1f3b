// Byte strings for what processes tell each other (transport.h): plain
// values copied as they are in memory (every process runs the same binary
// on the same kind of host) and length-prefixed strings. Thread safety: one object, one thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/errors.h"

namespace shardlab::wire {

class Writer {
 public:
  template <class T>
  Writer& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Writer& put_string(const std::string& s) {
    put<uint64_t>(s.size());
    out_ += s;
    return *this;
  }
  Writer& put_bytes(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  // A length-prefixed vector of plain values (Reader::get_vector).
  template <class T>
  Writer& put_vector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return put<uint64_t>(v.size()).put_bytes(v.data(), v.size() * sizeof(T));
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  explicit Reader(const std::string& s) : Reader(s.data(), s.size()) {}
  explicit Reader(std::string&&) = delete;  // it would read a destroyed temporary
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  std::string get_string() {
    const auto n = get<uint64_t>();
    return std::string(take(n), n);
  }
  template <class T>
  std::vector<T> get_vector() {
    static_assert(std::is_trivially_copyable_v<T>);
    std::vector<T> v(get<uint64_t>());
    if (!v.empty()) std::memcpy(v.data(), take(v.size() * sizeof(T)), v.size() * sizeof(T));
    return v;
  }
  const char* take(size_t n) {
    SHARDLAB_CHECK(size_t(end_ - p_) >= n, "truncated message between processes");
    const char* at = p_;
    p_ += n;
    return at;
  }
  size_t left() const { return size_t(end_ - p_); }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace shardlab::wire
