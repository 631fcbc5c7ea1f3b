#include "model/fusions.h"

#include <array>
#include <utility>

namespace shardlab::model {
namespace {

using Field = bool KernelFusions::*;
constexpr std::array<std::pair<std::string_view, Field>, 5> kFusions{{
    {"norm", &KernelFusions::norm},
    {"swiglu", &KernelFusions::swiglu},
    {"softmax", &KernelFusions::softmax},
    {"bias-dropout-add", &KernelFusions::bias_dropout_add},
    {"cross-entropy", &KernelFusions::cross_entropy},
}};

std::string names() {
  std::string s;
  for (const auto& [name, field] : kFusions) s += std::string(name) + ", ";
  return s + "all, none (no-NAME turns one off)";
}

}  // namespace

std::string to_string(const KernelFusions& f) {
  std::string s;
  for (const auto& [name, field] : kFusions)
    if (f.*field) s += (s.empty() ? "" : ",") + std::string(name);
  return s.empty() ? "none" : s;
}

bool parse_fusions(std::string_view list, KernelFusions& base, std::string& error) {
  KernelFusions f = base;
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    const bool off = item.starts_with("no-");
    const std::string_view name = off ? item.substr(3) : item;
    bool known = false;
    if (item == "all" || item == "none") {
      for (const auto& [n, field] : kFusions) f.*field = item == "all";
      known = true;
    }
    for (const auto& [n, field] : kFusions)
      if (name == n) f.*field = !off, known = true;
    if (!known) {
      error = "unknown kernel fusion '" + std::string(item) + "': one of " + names();
      return false;
    }
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  base = f;
  return true;
}

}  // namespace shardlab::model
