// The message of the ConfigError a call throws, or "(no ConfigError)".
#pragma once

#include <string>

#include "runtime/errors.h"

namespace shardlab::testing {

inline std::string config_error_of(auto&& call) {
  try {
    call();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace shardlab::testing
