// DeviceMesh: rank <-> coordinates over the parallel dimensions, and the
// process groups along them (Megatron's RankGenerator, picotron's grid).
//
// Dimensions: tp (tensor), cp (context), ep (expert), dp (data),
// pp (pipeline). The order string lists them fastest-varying first; the
// default "tp-cp-ep-dp-pp" puts TP groups inside a node and PP outermost.
//
// Expert parallelism divides data parallelism. The world is tp*cp*dp*pp
// ranks; the dp dimension is split into ep (fastest) x edp = dp/ep:
//
//   dp coordinate  = ep coordinate + ep * edp coordinate
//
// so the "ep" entry of the order string places the ep factor and the "dp"
// entry places the remaining dp/ep factor. The ep ranks inside one dp group
// hold different experts (group "ep"); the dp/ep ranks that hold the same
// experts form the expert-data-parallel group ("edp"), which reduces the
// expert gradients. With ep = 1, "dp" is plain data parallelism.
//
// Group specs name one or several dimensions joined by '-': "tp", "dp",
// "tp-dp", "ep", "edp", "pp"... A group holds the ranks that share every
// coordinate outside those dimensions, sorted by rank.
//
// A DeviceMesh is an immutable value: build one per program (or share one
// const instance between device threads).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab::collectives {

class ProcessGroup;

enum class Dim : int { kTp = 0, kCp, kEp, kDp, kPp };
inline constexpr int kNumDims = 5;

struct MeshShape {
  int tp = 1;
  int cp = 1;
  int ep = 1;  // divides dp
  int dp = 1;
  int pp = 1;
};

struct Coords {
  int tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
  int edp = 0;  // dp / ep: index among the ranks holding the same experts
  bool operator==(const Coords&) const = default;
};

class DeviceMesh {
 public:
  // Throws ConfigError on a size < 1, ep not dividing dp, or a bad order
  // string (unknown or repeated name; a missing name must have size 1).
  explicit DeviceMesh(MeshShape shape, std::string_view order = "tp-cp-ep-dp-pp");

  const MeshShape& shape() const { return shape_; }
  int size() const { return world_; }
  const std::string& order() const { return order_; }

  Coords coords(int rank) const;
  int rank(const Coords& c) const;  // uses tp, cp, ep, edp, pp (dp is derived)

  // The member ranks of the group along `dims` that contains `rank`.
  std::vector<int> group_ranks(int rank, std::string_view dims) const;
  // The index of `rank` in group_ranks(rank, dims), without building the
  // group (a preflight over 100,000 ranks asks it of every rank).
  int group_index(int rank, std::string_view dims) const;
  // Every group along `dims`, each sorted, ordered by smallest member.
  std::vector<std::vector<int>> all_group_ranks(std::string_view dims) const;
  // The ProcessGroup along `dims` as seen by `rank` (a member).
  ProcessGroup group(int rank, std::string_view dims) const;

  // "TP(2)-PP(2)-DP(2)-Rank(5)": dims of size > 1 in order, then the rank.
  // With ep > 1 the EP coordinate is shown too.
  std::string describe(int rank) const;
  // "tp=2 cp=1 ep=1 dp=2 pp=2 order tp-cp-ep-dp-pp"
  std::string to_string() const;

 private:
  // Factors in layout order: the mesh is a mixed-radix number, slot 0 fastest.
  // Factor ids are Dim values, with kDp standing for the edp factor.
  std::array<int, kNumDims> layout_{};   // layout_[slot] = factor id
  std::array<int, kNumDims> extent_{};   // extent_[factor id]
  std::array<int, kNumDims> stride_{};   // stride_[factor id]
  // Which factors a group spec spans; throws ConfigError on an unknown name.
  std::array<bool, kNumDims> parse_dims(std::string_view dims) const;
  void check_rank(int rank) const;

  MeshShape shape_;
  std::string order_;
  int world_ = 1;
};

}  // namespace shardlab::collectives
