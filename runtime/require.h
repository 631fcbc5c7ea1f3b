// The option validators' one-line check: ConfigError(message) unless `ok`.
// Thread safety: a pure function.
#pragma once

#include <string>

#include "runtime/errors.h"

namespace shardlab {

inline void require(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}

}  // namespace shardlab
