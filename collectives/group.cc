#include "collectives/group.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/errors.h"

namespace shardlab::collectives {
namespace {

// FNV-1a over the member list: deterministic on every host and member.
uint64_t hash_members(const std::vector<int>& members) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 4; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(members.size());
  for (int m : members) mix(static_cast<uint64_t>(m));
  return h;
}

constexpr int kHashShift = 40;
constexpr int kSeqShift = 8;
constexpr uint64_t kSeqMask = (1ull << 32) - 1;

}  // namespace

ProcessGroup::ProcessGroup(std::vector<int> members, int my_rank, std::string name)
    : members_(std::move(members)), name_(std::move(name)), state_(std::make_shared<State>()) {
  if (members_.empty()) throw ConfigError("process group: no members");
  std::vector<int> sorted = members_;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0)
    throw ConfigError(fmt::format("process group {}: members must be distinct ranks >= 0", name_));
  auto it = std::find(members_.begin(), members_.end(), my_rank);
  if (it == members_.end())
    throw ConfigError(fmt::format("process group {}: rank {} is not a member", name_, my_rank));
  index_ = static_cast<int>(it - members_.begin());
  const uint64_t h = hash_members(members_) & ((1ull << (63 - kHashShift)) - 1);
  tag_base_ = (1ull << 63) | (h << kHashShift);
}

ProcessGroup ProcessGroup::world(const Device& dev) {
  std::vector<int> all(static_cast<size_t>(dev.world_size()));
  std::iota(all.begin(), all.end(), 0);
  return ProcessGroup(std::move(all), dev.rank(), "world");
}

Tag ProcessGroup::next_tag() const {
  const uint64_t seq = state_->seq++ & kSeqMask;
  return tag_base_ | (seq << kSeqShift);
}

std::string ProcessGroup::to_string() const {
  const std::string name = name_.empty() ? "group" : name_;
  // A log line names a group of thousands: its first and last members and its size.
  constexpr size_t kHead = 8, kTail = 2;
  if (members_.size() <= kHead + kTail + 1) return fmt::format("{}[{}]", name, fmt::join(members_, ","));
  return fmt::format("{}[{},...,{}] ({} members)", name, fmt::join(members_.begin(), members_.begin() + kHead, ","),
                     fmt::join(members_.end() - kTail, members_.end(), ","), members_.size());
}

}  // namespace shardlab::collectives
