// Range: a half-open run of elements [begin, begin + size). The one range
// type of the project: flat offsets into a parameter or gradient buffer, the
// rows of a tensor a rank holds, a collective's chunk, a data-parallel bucket.
#pragma once

#include <cstdint>

namespace shardlab {

struct Range {
  int64_t begin = 0;
  int64_t size = 0;

  int64_t end() const { return begin + size; }
  bool empty() const { return size <= 0; }
  bool contains(int64_t i) const { return i >= begin && i < end(); }
  bool operator==(const Range&) const = default;
};

}  // namespace shardlab
