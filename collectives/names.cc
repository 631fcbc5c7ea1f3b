// Names and parsing of ops, algorithms and reduce ops.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/collectives.h"
#include "runtime/errors.h"

namespace shardlab::collectives {
namespace {

constexpr const char* kOps[] = {"sum", "avg", "max"};
constexpr const char* kAlgos[] = {"auto", "ring", "tree", "direct", "dbtree", "nvls"};
constexpr const char* kProtos[] = {"auto", "LL", "LL128", "Simple", "plain"};
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
const char* proto_name(Proto p) { return kProtos[static_cast<int>(p)]; }
Proto parse_proto(std::string_view s) { return parse_name<Proto>(s, kProtos, "protocol"); }
ReduceOp parse_reduce_op(std::string_view s) { return parse_name<ReduceOp>(s, kOps, "reduce op"); }
Algo parse_algo(std::string_view s) { return parse_name<Algo>(s, kAlgos, "algorithm"); }
OpKind parse_op_kind(std::string_view s) { return parse_name<OpKind>(s, kKinds, "op"); }

}  // namespace shardlab::collectives
