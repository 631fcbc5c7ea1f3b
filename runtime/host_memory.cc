#include "runtime/host_memory.h"

#include <unistd.h>

namespace shardlab {

uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? uint64_t(pages) * uint64_t(size) : UINT64_MAX;
}

}  // namespace shardlab
