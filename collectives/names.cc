// Names, parsing, chunking and the `auto` algorithm choice.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/collectives.h"
#include "runtime/errors.h"

namespace shardlab::collectives {
namespace {

constexpr const char* kOps[] = {"sum", "avg", "max"};
constexpr const char* kAlgos[] = {"auto", "ring", "tree", "direct"};
constexpr const char* kKinds[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                  "reduce",     "all_to_all",     "barrier"};

template <class E, size_t N>
E parse_name(std::string_view s, const char* const (&names)[N], const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<E>(i);
  throw ConfigError(fmt::format("unknown {} \"{}\" (one of: {})", what, s, fmt::join(names, ", ")));
}

}  // namespace

const char* reduce_op_name(ReduceOp op) { return kOps[static_cast<int>(op)]; }
const char* algo_name(Algo a) { return kAlgos[static_cast<int>(a)]; }
const char* op_kind_name(OpKind k) { return kKinds[static_cast<int>(k)]; }
ReduceOp parse_reduce_op(std::string_view s) { return parse_name<ReduceOp>(s, kOps, "reduce op"); }
Algo parse_algo(std::string_view s) { return parse_name<Algo>(s, kAlgos, "algorithm"); }
OpKind parse_op_kind(std::string_view s) { return parse_name<OpKind>(s, kKinds, "op"); }

// `auto`, in the spirit of NCCL's tuner, by the full buffer's modeled bytes S:
//  * all_to_all: direct (NCCL posts all peers' sends at once too);
//  * barrier: dissemination (the only algorithm);
//  * otherwise direct when n <= 2 or S·(n-1) <= 4 MiB inside a node, 1 MiB
//    for a group spanning nodes (latency-bound: one latency beats log2(n) or
//    2(n-1) of them while the serialized bytes are few; across nodes those
//    bytes serialize on the slow inter-node port), the recursive
//    halving/doubling or binomial tree when S <= 8 MiB, and the ring
//    (pipelined chain for broadcast/reduce) above that.
Algo select_algo(OpKind op, int group_size, uint64_t modeled_bytes, bool multi_node) {
  const uint64_t kDirectBytes = multi_node ? 1ull << 20 : 4ull << 20;
  constexpr uint64_t kTreeBytes = 8ull << 20;
  if (op == OpKind::kAllToAll) return Algo::kDirect;
  if (op == OpKind::kBarrier) return Algo::kTree;
  const auto peers = static_cast<uint64_t>(std::max(group_size - 1, 0));
  if (group_size <= 2 || modeled_bytes * peers <= kDirectBytes) return Algo::kDirect;
  if (modeled_bytes <= kTreeBytes) return Algo::kTree;
  return Algo::kRing;
}

}  // namespace shardlab::collectives
