#include "model/parallel/recompute.h"

#include <string>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::parallel {

Recompute parse_recompute(std::string_view name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  throw ConfigError(fmt::format("`recompute` \"{}\": expected none, selective or full", name));
}

const char* recompute_name(Recompute r) {
  return r == Recompute::kFull ? "full" : r == Recompute::kSelective ? "selective" : "none";
}

}  // namespace shardlab::parallel
