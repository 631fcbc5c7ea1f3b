#include "model/sink.h"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace shardlab::model {

const char* recompute_name(const char* name) {
  static std::mutex mu;
  // Keyed by the literal's address: no allocation once a name is known.
  static std::unordered_map<const char*, std::unique_ptr<std::string>> names;  // GUARDED_BY(mu)
  std::lock_guard lock(mu);
  auto& slot = names[name];
  if (!slot) slot = std::make_unique<std::string>(std::string(name) + ".recompute");
  return slot->c_str();
}

}  // namespace shardlab::model
