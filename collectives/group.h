// ProcessGroup: the ranks one collective runs over, as seen by one member.
//
// A group is a value that each member's program builds (usually through
// DeviceMesh::group) and passes explicitly to the collectives; there is no
// global registry. Members are listed in group order (ring order); a
// member's index in that list is its group rank.
//
// Tags. Every message of a collective carries a 64-bit tag
//
//   bit 63      1 (collective traffic; user p2p tags stay below 2^63)
//   bits 40-62  hash of the member list: the same on every member
//   bits  8-39  the member's sequence number for this group
//   bits  0-7   phase within one collective algorithm
//
// Each member counts the collectives it issued on the group; since every
// member issues the group's collectives in the same order, the counters agree
// and successive collectives never mix messages even when one member runs
// ahead. Copies of a ProcessGroup share their counter and scratch space
// (they are the same group on the same device); two groups built separately
// from the same member list on one device must not be used interleaved.
//
// Thread safety: a ProcessGroup (and its copies) belongs to one device thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/fabric.h"

namespace shardlab::collectives {

class ProcessGroup {
 public:
  // `members` are global ranks (distinct); `my_rank` must be one of them.
  // Throws ConfigError otherwise.
  ProcessGroup(std::vector<int> members, int my_rank, std::string name = "");
  // Every device of the cluster, in rank order.
  static ProcessGroup world(const Device& dev);

  int size() const { return static_cast<int>(members_.size()); }
  int rank() const { return index_; }                 // my index in the group
  int global_rank() const { return members_[static_cast<size_t>(index_)]; }
  int global_rank(int index) const { return members_[static_cast<size_t>(index)]; }
  const std::vector<int>& members() const { return members_; }
  const std::string& name() const { return name_; }
  uint64_t tag_base() const { return tag_base_; }

  // Reserves the tag space of the next collective on this group.
  Tag next_tag() const;
  // How many collectives this member has issued on the group.
  uint64_t sequence() const { return state_->seq; }

  // Reusable host scratch, grown on demand (no allocation in steady state).
  std::vector<float>& scratch(int slot = 0) const { return state_->scratch[slot]; }
  std::vector<Message>& inbox() const { return state_->inbox; }
  std::vector<size_t>& index_scratch() const { return state_->sizes; }

  // "tp[0,1]" (name and members); past 11 members the first 8, the last 2
  // and the count: "dp[0,2,4,6,8,10,12,14,...,92,94] (48 members)".
  std::string to_string() const;

 private:
  struct State {
    uint64_t seq = 0;
    std::vector<float> scratch[2];
    std::vector<Message> inbox;
    std::vector<size_t> sizes;
  };
  std::vector<int> members_;
  int index_ = 0;
  std::string name_;
  uint64_t tag_base_ = 0;
  std::shared_ptr<State> state_;
};

// The finishing point of a collective on the communication stream.
class Work {
 public:
  Work() = default;
  explicit Work(Event done) : done_(done) {}
  Event event() const { return done_; }
  // `s` (typically dev.compute()) waits until the collective has finished.
  void wait(Stream& s) const { s.wait(done_); }

 private:
  Event done_;
};

}  // namespace shardlab::collectives
