#include "runtime/time.h"

#include <cmath>

#include "runtime/errors.h"

namespace shardlab {

Time us_to_time(double us) { return static_cast<Time>(std::llround(us * 1e6)); }

Time transfer_time(uint64_t bytes, uint64_t bytes_per_second) {
  SHARDLAB_CHECK(bytes_per_second > 0);
  __extension__ using u128 = unsigned __int128;
  const u128 num = static_cast<u128>(bytes) * 1'000'000'000'000ULL;
  return static_cast<Time>((num + bytes_per_second - 1) / bytes_per_second);
}

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "shardlab: internal check failed: %s at %s:%d %s\n", expr, file, line,
               msg.c_str());
  std::abort();
}

}  // namespace shardlab
