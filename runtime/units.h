// Byte sizes for humans: "64MiB" <-> 67108864.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shardlab {

// Accepts a plain count or a number with a suffix: K/M/G/T or KiB/MiB/GiB/TiB
// (powers of 1024, as nccl-tests reads them), KB/MB/GB/TB (powers of 1000), B.
// Throws ConfigError("<flag>: cannot parse size ...") on anything else.
uint64_t parse_bytes(std::string_view text, std::string_view flag);

// 1536 -> "1.5 KiB"; exact small counts stay in bytes ("512 B").
std::string format_bytes(uint64_t bytes);

}  // namespace shardlab
