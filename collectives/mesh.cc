#include "collectives/mesh.h"

#include <algorithm>

#include <fmt/format.h>

#include "collectives/group.h"
#include "runtime/errors.h"

namespace shardlab::collectives {
namespace {

constexpr const char* kNames[kNumDims] = {"tp", "cp", "ep", "dp", "pp"};

int find_dim(std::string_view name) {
  for (int d = 0; d < kNumDims; ++d)
    if (name == kNames[d]) return d;
  return -1;
}

std::vector<std::string_view> split_dims(std::string_view s) {
  std::vector<std::string_view> out;
  while (true) {
    const size_t dash = s.find('-');
    out.push_back(s.substr(0, dash));
    if (dash == std::string_view::npos) break;
    s.remove_prefix(dash + 1);
  }
  return out;
}

}  // namespace

DeviceMesh::DeviceMesh(MeshShape shape, std::string_view order) : shape_(shape), order_(order) {
  const int sizes[kNumDims] = {shape.tp, shape.cp, shape.ep, shape.dp, shape.pp};
  for (int d = 0; d < kNumDims; ++d)
    if (sizes[d] < 1) throw ConfigError(fmt::format("mesh: {} size {} must be at least 1", kNames[d], sizes[d]));
  if (shape.dp % shape.ep != 0)
    throw ConfigError(fmt::format("mesh: ep {} must divide dp {} (expert parallelism splits data parallelism)",
                                  shape.ep, shape.dp));
  extent_ = {shape.tp, shape.cp, shape.ep, shape.dp / shape.ep, shape.pp};
  std::array<bool, kNumDims> seen{};
  int slot = 0;
  for (std::string_view name : split_dims(order)) {
    const int d = find_dim(name);
    if (d < 0 || seen[d])
      throw ConfigError(fmt::format("mesh: order \"{}\": {} name \"{}\" (use tp, cp, ep, dp, pp joined by '-')",
                                    order, d < 0 ? "unknown" : "repeated", name));
    seen[d] = true;
    layout_[slot++] = d;
  }
  for (int d = 0; d < kNumDims; ++d) {
    if (seen[d]) continue;
    if (sizes[d] != 1)
      throw ConfigError(fmt::format("mesh: order \"{}\" leaves out {}, whose size is {}", order, kNames[d], sizes[d]));
    layout_[slot++] = d;
  }
  world_ = 1;
  for (int s = 0; s < kNumDims; ++s) {
    stride_[layout_[s]] = world_;
    world_ *= extent_[layout_[s]];
  }
}

// A rank outside the mesh is the caller's error (a device program of the C++
// API), reported as the mesh's other misuses are, not an abort.
void DeviceMesh::check_rank(int rank) const {
  if (rank < 0 || rank >= world_) throw ConfigError(fmt::format("mesh: rank {} outside the mesh of {}", rank, world_));
}

Coords DeviceMesh::coords(int rank) const {
  check_rank(rank);
  auto at = [&](Dim d) { return rank / stride_[static_cast<int>(d)] % extent_[static_cast<int>(d)]; };
  Coords c;
  c.tp = at(Dim::kTp);
  c.cp = at(Dim::kCp);
  c.ep = at(Dim::kEp);
  c.edp = at(Dim::kDp);
  c.pp = at(Dim::kPp);
  c.dp = c.ep + shape_.ep * c.edp;
  return c;
}

int DeviceMesh::rank(const Coords& c) const {
  const int v[kNumDims] = {c.tp, c.cp, c.ep, c.edp, c.pp};
  int r = 0;
  for (int d = 0; d < kNumDims; ++d) {
    if (v[d] < 0 || v[d] >= extent_[d])
      throw ConfigError(fmt::format("mesh: {} coordinate {} outside [0, {})", kNames[d], v[d], extent_[d]));
    r += v[d] * stride_[d];
  }
  return r;
}

std::array<bool, kNumDims> DeviceMesh::parse_dims(std::string_view dims) const {
  std::array<bool, kNumDims> span{};
  for (std::string_view name : split_dims(dims)) {
    if (name == "edp") {
      span[static_cast<int>(Dim::kDp)] = true;  // the dp/ep factor alone
      continue;
    }
    const int d = find_dim(name);
    if (d < 0)
      throw ConfigError(fmt::format("mesh: group \"{}\": unknown dimension \"{}\" (tp, cp, ep, dp, edp, pp)", dims, name));
    span[d] = true;
    if (d == static_cast<int>(Dim::kDp)) span[static_cast<int>(Dim::kEp)] = true;  // dp = ep x edp
  }
  return span;
}

std::vector<int> DeviceMesh::group_ranks(int rank, std::string_view dims) const {
  const std::array<bool, kNumDims> span = parse_dims(dims);
  check_rank(rank);
  // Zero the spanned digits to find the group's base rank, then enumerate them.
  int base = rank;
  for (int d = 0; d < kNumDims; ++d)
    if (span[d]) base -= rank / stride_[d] % extent_[d] * stride_[d];
  std::vector<int> members{base};
  for (int d = 0; d < kNumDims; ++d) {
    if (!span[d]) continue;
    const size_t n = members.size();
    for (int i = 1; i < extent_[d]; ++i)
      for (size_t j = 0; j < n; ++j) members.push_back(members[j] + i * stride_[d]);
  }
  std::sort(members.begin(), members.end());
  return members;
}

int DeviceMesh::group_index(int rank, std::string_view dims) const {
  const std::array<bool, kNumDims> span = parse_dims(dims);
  check_rank(rank);
  // Sorted by rank, the members count the spanned digits as one mixed-radix
  // number, the smallest stride fastest (layout order).
  int index = 0, scale = 1;
  for (int slot = 0; slot < kNumDims; ++slot) {
    const int d = layout_[size_t(slot)];
    if (!span[size_t(d)]) continue;
    index += rank / stride_[size_t(d)] % extent_[size_t(d)] * scale;
    scale *= extent_[size_t(d)];
  }
  return index;
}

std::vector<std::vector<int>> DeviceMesh::all_group_ranks(std::string_view dims) const {
  std::vector<std::vector<int>> groups;
  std::vector<bool> done(static_cast<size_t>(world_), false);
  for (int r = 0; r < world_; ++r) {
    if (done[static_cast<size_t>(r)]) continue;
    groups.push_back(group_ranks(r, dims));
    for (int m : groups.back()) done[static_cast<size_t>(m)] = true;
  }
  return groups;
}

ProcessGroup DeviceMesh::group(int rank, std::string_view dims) const {
  return ProcessGroup(group_ranks(rank, dims), rank, std::string(dims));
}

std::string DeviceMesh::describe(int rank) const {
  std::string s = fmt::format("TP({})", shape_.tp);
  if (shape_.cp > 1) s += fmt::format("-CP({})", shape_.cp);
  if (shape_.ep > 1) s += fmt::format("-EP({})", shape_.ep);
  s += fmt::format("-PP({})-DP({})-Rank({})", shape_.pp, shape_.dp, rank);
  return s;
}

std::string DeviceMesh::to_string() const {
  return fmt::format("tp={} cp={} ep={} dp={} pp={} order {}", shape_.tp, shape_.cp, shape_.ep, shape_.dp,
                     shape_.pp, order_);
}

}  // namespace shardlab::collectives
