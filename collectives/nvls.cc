// NVLink SHARP's all_reduce inside one node (Algo::kNvls; tuner.h has the
// model and its sources): a direct reduce_scatter and a direct all_gather
// whose messages carry NVLS's traffic per direction, S(n+1)/n, at the
// switch's rate.
#include <algorithm>

#include "collectives/detail.h"

namespace shardlab::collectives {

bool nvls_applies(const HardwareProfile& p, std::span<const int> members, const CollShape& s) {
  if (s.op != OpKind::kAllReduce || members.size() < 2 || p.intra.nvls_efficiency <= 0 || !p.pcie.empty())
    return false;
  const int node = p.node_of(members.front());
  return std::all_of(members.begin(), members.end(), [&](int m) { return p.node_of(m) == node; });
}

void require_nvls(const HardwareProfile& p, std::span<const int> members, const CollShape& s, std::string_view group) {
  if (!nvls_applies(p, members, s))
    throw ConfigError(fmt::format("`algo` nvls: {} on {}: NVLink SHARP runs all_reduce on 2 or more members of one "
                                  "node whose NVSwitch has it (profile links.intra.nvls_efficiency; {} has {})",
                                  op_kind_name(s.op), group, p.name, p.intra.nvls_efficiency));
  if (s.proto != Proto::kAuto && s.proto != Proto::kSimple && s.proto != Proto::kPlain)
    throw ConfigError(fmt::format("`algo` nvls on {}: NVLink SHARP runs only the Simple protocol, not {}", group,
                                  proto_name(s.proto)));
}

namespace detail {

size_t nvls_charged(size_t count, int n) {
  // 2(n-1) messages each way carry count(n+1)/n elements: count(n+1) over 2n(n-1), rounded up.
  __extension__ using u128 = unsigned __int128;
  const auto un = static_cast<u128>(n);
  const u128 num = static_cast<u128>(count) * (un + 1), den = 2 * un * (un - 1);
  return static_cast<size_t>((num + den - 1) / den);
}

uint64_t nvls_rate(const HardwareProfile& p) {
  return std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(p.intra.bytes_per_second()) *
                                                     p.intra.nvls_efficiency));
}

void nvls_all_reduce(Ctx& c, const float* in, float* out, size_t count, ReduceOp op) {
  const size_t charged = nvls_charged(count, c.n());
  c.set_rate_cap(nvls_rate(c.dev().profile()));
  const Range mine = chunk_range(count, c.n(), c.me());
  // The owner's sum lands in its slice of `out` (in may alias out: the
  // slices for the others leave first, as copies).
  direct_reduce_scatter(c, in, out ? out + mine.begin : nullptr, count, op, charged);
  direct_all_gather(c, out, count, charged);
}

}  // namespace detail
}  // namespace shardlab::collectives
