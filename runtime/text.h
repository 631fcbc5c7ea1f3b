// Text helpers the spec parsers share (faults, serving workloads).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardlab {

// `text` cut at every `sep`: "a:b::c" -> {"a", "b", "", "c"}, "a:" -> {"a",
// ""}, "" -> {""}. Part = std::string_view gives views into `text`,
// std::string copies.
template <class Part = std::string_view>
std::vector<Part> split(std::string_view text, char sep) {
  std::vector<Part> parts;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(sep, start);
    parts.emplace_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

}  // namespace shardlab
