// The profile's "protocols" field (runtime/profile.h) as JSON: written and
// read by profile_json.cc, checked here. Internal to runtime/profile*.cc.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/profile.h"

namespace shardlab {

nlohmann::json protocols_to_json(const std::vector<ProtocolSpec>& protocols);
// Reads "protocols" (every protocol required, each with base_latency_us and
// intra/inter {hop_latency_us, bw_share}); throws ConfigError naming the
// field, prefixed "profile <origin>: ".
std::vector<ProtocolSpec> protocols_from_json(const nlohmann::json& j, std::string_view origin);
// Whether `path` (dotted, from the profile's root) is a field of "protocols".
bool known_protocol_field(std::string_view path);

}  // namespace shardlab
