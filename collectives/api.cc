// The public collective entry points: argument checks, algorithm choice, the
// comm-stream bracket (wait for `after`, run, record), and the blocking forms.
#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/detail.h"
#include "collectives/folded.h"
#include "collectives/rendezvous.h"
#include "collectives/replay_share.h"
#include "collectives/tuner.h"
#include "runtime/profile.h"

namespace shardlab::collectives {
namespace {

using detail::Ctx;

// A caller's misuse of the API (not the user's input): std::invalid_argument.
void require_argument(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// The tuner's choice, computed once for each group, shape and requested
// algorithm: select() replays every algorithm under every protocol, and a
// training step repeats the same collectives thousands of times (a phantom
// 1T step spent over half its host time there). The choice is a pure
// function of the profile, the members and the shape, so the cache changes
// no figure. Each device thread keeps the choices it met (no lock on a
// hit); behind them one table for the process, keyed by the profile's text
// (profile_to_json: every field, so two profiles never share an entry
// whatever their addresses) and the group moved onto the first nodes
// (node_shifted), so the threads of one group and the pipeline's stages,
// whose groups differ by whole nodes, share one selection (the DeepSeek-V3
// step on 2,048 GPUs: 128 threads, 8 per dp group, 16 stages).
struct ChoiceKey {
  const void*
      profile;  // the thread's table: the profile's address; the process's: its interned text
  std::vector<int> members;
  OpKind op;
  size_t count;
  int elem_size, root;
  Proto proto;
  Algo algo;
  bool dbtree;
  bool operator==(const ChoiceKey&) const = default;
};
struct ChoiceKeyHash {
  size_t operator()(const ChoiceKey& k) const {
    size_t h = std::hash<const void*>()(k.profile);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    for (int m : k.members) mix(static_cast<size_t>(m));
    mix(static_cast<size_t>(k.op));
    mix(k.count);
    mix(static_cast<size_t>(k.elem_size));
    mix(static_cast<size_t>(k.root));
    mix(static_cast<size_t>(k.proto));
    mix(static_cast<size_t>(k.algo));
    mix(static_cast<size_t>(k.dbtree));
    return h;
  }
};

// The process's table. An entry is filled once, outside the table's lock:
// the first thread to need it selects, the others wait for it.
struct SharedChoice {
  std::once_flag once;
  Choice choice;
};
struct SharedChoices {
  std::mutex mu;
  std::unordered_map<ChoiceKey, std::shared_ptr<SharedChoice>, ChoiceKeyHash> chosen;
};

Choice select_shared(const HardwareProfile& p, std::span<const int> members, const CollShape& shape,
                     Algo algo) {
  static SharedChoices table;
  const std::string* text = detail::interned_profile_text(p);
  ChoiceKey key{text,
                node_shifted(p, members),
                shape.op,
                shape.count,
                shape.elem_size,
                shape.root,
                shape.proto,
                algo};
  std::shared_ptr<SharedChoice> entry;
  {
    const std::lock_guard<std::mutex> lock(table.mu);
    if (table.chosen.size() >= 65536) table.chosen.clear();  // bounded: waiters hold their entries
    std::shared_ptr<SharedChoice>& e = table.chosen[key];
    if (!e) e = std::make_shared<SharedChoice>();
    entry = e;
  }
  std::call_once(entry->once, [&] { entry->choice = select(p, key.members, shape, algo); });
  return entry->choice;
}

Choice select_once(const HardwareProfile& p, std::span<const int> members, const CollShape& shape, Algo algo) {
  thread_local std::unordered_map<ChoiceKey, Choice, ChoiceKeyHash> chosen;
  thread_local ChoiceKey probe;  // reused: a hit allocates nothing
  probe.profile = &p;
  probe.members.assign(members.begin(), members.end());
  probe.op = shape.op;
  probe.count = shape.count;
  probe.elem_size = shape.elem_size;
  probe.root = shape.root;
  probe.proto = shape.proto;
  probe.algo = algo;
  probe.dbtree = shape.dbtree;
  if (auto it = chosen.find(probe); it != chosen.end()) return it->second;
  const Choice c = select_shared(p, members, shape, algo);
  if (chosen.size() >= 4096) chosen.clear();  // bounded: a run has far fewer distinct calls
  chosen.emplace(probe, c);
  return c;
}

// The algorithm and the protocol a call runs, and its shape with that
// protocol: kAuto's are the tuner's choice for this group, profile and size
// (the same on every member: it depends on nothing a member owns alone).
struct Resolved {
  Algo algo;
  CollShape shape;
};
Resolved resolve(const Device& dev, const ProcessGroup& g, const CollOptions& opt, CollShape shape) {
  const HardwareProfile& p = dev.profile();
  shape.proto = opt.proto;
  shape.dbtree = opt.auto_dbtree;
  if (opt.proto != Proto::kAuto && opt.proto != Proto::kPlain) {
    const std::vector<Proto> ok = candidate_protos(p, g.members());
    require_argument(std::find(ok.begin(), ok.end(), opt.proto) != ok.end(),
                     fmt::format("collective on {}: protocol {} is not used on profile {}'s links of this group",
                                 g.to_string(), proto_name(opt.proto), p.name));
  }
  if (opt.algo == Algo::kDbtree && !dbtree_applies(p, g.members(), shape))
    throw ConfigError(fmt::format("`algo` dbtree: {} on {}: dbtree runs all_reduce on a group spanning 2 or more "
                                  "nodes with the same number of members on each",
                                  op_kind_name(shape.op), g.to_string()));
  if (opt.algo == Algo::kNvls) require_nvls(p, g.members(), shape, g.to_string());
  if (opt.algo != Algo::kAuto && opt.proto != Proto::kAuto) return {opt.algo, shape};
  const Choice c = select_once(p, g.members(), shape, opt.algo);
  shape.proto = c.proto;
  return {c.algo, shape};
}

// While a collective runs on a device with injected faults, the device's
// activity names it ("all_reduce (ring) on dp[0,1,2,3]"): a dead device or
// a downed link says what was in flight (runtime/fault.h).
class Activity {
 public:
  Activity(Device& dev, const ProcessGroup& g, const CollShape* shape, Algo algo) : dev_(dev) {
    if (!dev.faulty()) return;
    dev.activity() = fmt::format("{} ({}) on {}", shape ? op_kind_name(shape->op) : "all_to_all_v",
                                 algo_name(algo), g.to_string());
  }
  ~Activity() {
    if (dev_.faulty()) dev_.activity().clear();
  }
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  Device& dev_;
};

// Waits for `after`, runs the algorithm on the comm stream, returns its end.
// `shape` and `algo` describe the call for a folded group (folded.h); null
// shape: the call cannot be folded (all_to_all_v's unequal per-member counts).
// `meet`: the call's buffers, when it may run as a meeting (rendezvous.h).
template <class Body>
Work run_on_comm(Device& dev, const ProcessGroup& g, const CollOptions& opt, const CollShape* shape,
                 Algo algo, Proto proto, Body body, const detail::MeetData* meet = nullptr) {
  require_argument(g.global_rank() == dev.rank(),
                   fmt::format("collective on {} called by device {}, not this group's member",
                               g.to_string(), dev.rank()));
  Stream& s = opt.stream ? *opt.stream : dev.comm();
  s.wait(opt.after ? *opt.after : dev.compute().record());
  // The kernel launch and the protocol's setup: a fixed start before the first send.
  const Time start = s.now();
  const Time launch = collective_start(dev.profile(), g.size(), proto);
  if (launch > 0) s.run("coll.launch", launch, 0, 0.0);
  if (detail::has_folded_member(dev, g)) {
    if (!shape)
      throw FoldingError(fmt::format("folding: all_to_all_v on {} cannot be folded (unequal per-member counts)",
                                     g.to_string()));
    detail::run_folded(dev, g, s, g.next_tag(), *shape, algo);
  } else if (meet && shape && detail::can_meet(dev, g, *shape, algo)) {
    detail::run_met(dev, g, s, g.next_tag(), *shape, algo, *meet);
  } else {
    const Activity activity(dev, g, shape, algo);
    Ctx c(dev, g, s, opt.wire_elem(dev), proto_engine(proto));
    body(c);
    c.finish();
  }
  // Off the compute stream, the collective's kernels hold one SM per
  // channel while it runs (Device::note_collective).
  if (&s != &dev.compute() && g.size() > 1)
    dev.note_collective(start, s.now(),
                        opt.sm_blocks >= 0                ? opt.sm_blocks
                        : algo == Algo::kDbtree ? tree_plan(dev.profile(), g.members()).channels
                                                : ring_plan(dev.profile(), g.members()).channels);
  return Work(s.record());
}

void check_pair(const char* op, ConstBuffer in, Buffer out) {
  require_argument((in.data == nullptr) == (out.data == nullptr) || in.count == 0 || out.count == 0,
                   fmt::format("{}: input and output must both be real or both phantom", op));
}

// reduce-scatter then all-gather on `work` (count elements), by `algo`.
void reduce_scatter_all_gather(Ctx& c, Algo algo, float* work, size_t count, ReduceOp op) {
  const Range mine = chunk_range(count, c.n(), c.me());
  if (algo == Algo::kRing) {
    const RingPlan plan = ring_plan(c.dev().profile(), c.group().members());
    if (plan.single()) {
      detail::ring_reduce_scatter(c, work, count, op, 0);
    } else {
      detail::channel_ring_reduce_scatter(c, plan, work, count, op, 0);
    }
    detail::finalize(work ? work + mine.begin : nullptr, mine.size, op, c.n());
    if (plan.single()) return detail::ring_all_gather(c, work, count, 1);
    detail::channel_ring_all_gather(c, plan, work, count, 1);
  } else {
    detail::halving_reduce_scatter(c, work, count, op, 0);
    detail::finalize(work ? work + mine.begin : nullptr, mine.size, op, c.n());
    detail::doubling_all_gather(c, work, count, 1);
  }
}

}  // namespace

bool spans_nodes(const Device& dev, const ProcessGroup& g) {
  const int first = dev.profile().node_of(g.global_rank(0));
  for (int m : g.members())
    if (dev.profile().node_of(m) != first) return true;
  return false;
}

Range chunk_range(size_t count, int n, int i) {
  // count * i fits in 64 bits for any buffer a host can hold (< 2^40 elements, n < 2^20).
  const auto un = static_cast<uint64_t>(n), ui = static_cast<uint64_t>(i);
  const size_t b = static_cast<size_t>(count * ui / un);
  const size_t e = static_cast<size_t>(count * (ui + 1) / un);
  return {static_cast<int64_t>(b), static_cast<int64_t>(e - b)};
}

Work iall_reduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, ReduceOp op,
                 const CollOptions& opt) {
  require_argument(
      in.count == out.count,
      fmt::format("all_reduce: input has {} elements, output {}", in.count, out.count));
  check_pair("all_reduce", in, out);
  const Resolved r = resolve(dev, g, opt, {OpKind::kAllReduce, in.count, opt.wire_elem(dev)});
  const Algo algo = r.algo;
  const detail::MeetData meet{in.data, out.data, op};
  return run_on_comm(
      dev, g, opt, &r.shape, algo, r.shape.proto,
      [&](Ctx& c) {
        if (algo == Algo::kDirect) return detail::direct_all_reduce(c, in.data, out.data, in.count, op);
        if (algo == Algo::kNvls) return detail::nvls_all_reduce(c, in.data, out.data, in.count, op);
        detail::copy(out.data, in.data, in.count);
        if (algo == Algo::kDbtree)
          return detail::dbtree_all_reduce(c, tree_plan(dev.profile(), g.members()), out.data, out.count, op);
        reduce_scatter_all_gather(c, algo, out.data, out.count, op);
      },
      &meet);
}

Work ireduce_scatter(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, ReduceOp op,
                     const CollOptions& opt) {
  const Range mine = chunk_range(in.count, g.size(), g.rank());
  require_argument(out.count == size_t(mine.size),
                   fmt::format("reduce_scatter: {} elements over {} members: member {} gets {}, "
                               "output has {}",
                               in.count, g.size(), g.rank(), mine.size, out.count));
  check_pair("reduce_scatter", in, out);
  const Resolved r = resolve(dev, g, opt, {OpKind::kReduceScatter, in.count, opt.wire_elem(dev)});
  const Algo algo = r.algo;
  return run_on_comm(dev, g, opt, &r.shape, algo, r.shape.proto, [&](Ctx& c) {
    if (algo == Algo::kDirect) return detail::direct_reduce_scatter(c, in.data, out.data, in.count, op);
    // In place (out at its chunk of in): reduce in `in` itself, clobbering the
    // other chunks; otherwise in a scratch copy.
    float* work = const_cast<float*>(in.data);
    if (in.data && out.data != in.data + mine.begin) {
      work = detail::scratch(g, in.count, false);
      detail::copy(work, in.data, in.count);
    }
    if (algo == Algo::kRing) {
      const RingPlan plan = ring_plan(dev.profile(), g.members());
      if (plan.single()) {
        detail::ring_reduce_scatter(c, work, in.count, op, 0);
      } else {
        detail::channel_ring_reduce_scatter(c, plan, work, in.count, op, 0);
      }
    } else {
      detail::halving_reduce_scatter(c, work, in.count, op, 0);
    }
    detail::copy(out.data, work ? work + mine.begin : nullptr, mine.size);
    detail::finalize(out.data, mine.size, op, g.size());
  });
}

Work iall_gather(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, const CollOptions& opt) {
  const Range mine = chunk_range(out.count, g.size(), g.rank());
  require_argument(in.count == size_t(mine.size),
                   fmt::format("all_gather: {} elements over {} members: member {} contributes {}, "
                               "input has {}",
                               out.count, g.size(), g.rank(), mine.size, in.count));
  check_pair("all_gather", in, out);
  const Resolved r = resolve(dev, g, opt, {OpKind::kAllGather, out.count, opt.wire_elem(dev)});
  const Algo algo = r.algo;
  const detail::MeetData meet{in.data, out.data};
  return run_on_comm(
      dev, g, opt, &r.shape, algo, r.shape.proto,
      [&](Ctx& c) {
        detail::copy(out.data ? out.data + mine.begin : nullptr, in.data, in.count);
        if (algo == Algo::kDirect) return detail::direct_all_gather(c, out.data, out.count);
        if (algo == Algo::kRing) {
          const RingPlan plan = ring_plan(dev.profile(), g.members());
          if (plan.single()) return detail::ring_all_gather(c, out.data, out.count, 0);
          return detail::channel_ring_all_gather(c, plan, out.data, out.count, 0);
        }
        detail::doubling_all_gather(c, out.data, out.count, 0);
      },
      &meet);
}

Work ibroadcast(Device& dev, const ProcessGroup& g, Buffer data, int root, const CollOptions& opt) {
  require_argument(root >= 0 && root < g.size(),
                   fmt::format("broadcast: root {} outside group of {}", root, g.size()));
  const Resolved r = resolve(dev, g, opt, {OpKind::kBroadcast, data.count, opt.wire_elem(dev), root});
  const Algo algo = r.algo;
  return run_on_comm(dev, g, opt, &r.shape, algo, r.shape.proto, [&](Ctx& c) {
    if (algo == Algo::kDirect) return detail::direct_broadcast(c, data.data, data.count, root);
    if (algo == Algo::kRing) {
      const RingPlan plan = ring_plan(c.dev().profile(), c.group().members());
      if (plan.single()) return detail::chain_broadcast(c, data.data, data.count, root);
      return detail::channel_chain_broadcast(c, plan, data.data, data.count, root);
    }
    detail::binomial_broadcast(c, data.data, data.count, root);
  });
}

Work ireduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, int root, ReduceOp op,
             const CollOptions& opt) {
  require_argument(root >= 0 && root < g.size(),
                   fmt::format("reduce: root {} outside group of {}", root, g.size()));
  const bool is_root = g.rank() == root;
  require_argument(
      !is_root || out.count == in.count,
      fmt::format("reduce: root output has {} elements, input {}", out.count, in.count));
  if (is_root) check_pair("reduce", in, out);
  const Resolved r = resolve(dev, g, opt, {OpKind::kReduce, in.count, opt.wire_elem(dev), root});
  const Algo algo = r.algo;
  return run_on_comm(dev, g, opt, &r.shape, algo, r.shape.proto, [&](Ctx& c) {
    if (algo == Algo::kDirect) return detail::direct_reduce(c, in.data, out.data, in.count, op, root);
    float* acc = is_root ? out.data : detail::scratch(g, in.count, in.data == nullptr);
    if (algo == Algo::kRing) {
      detail::copy(acc, in.data, in.count);
      const RingPlan plan = ring_plan(c.dev().profile(), c.group().members());
      if (plan.single())
        detail::chain_reduce(c, acc, in.count, op, root);
      else
        detail::channel_chain_reduce(c, plan, acc, in.count, op, root);
    } else {
      detail::binomial_reduce(c, in.data, acc, in.count, op, root);
    }
    if (is_root) detail::finalize(out.data, out.count, op, g.size());
  });
}

Work iall_to_all(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, const CollOptions& opt) {
  const int n = g.size();
  require_argument(
      in.count == out.count && in.count % static_cast<size_t>(n) == 0,
      fmt::format(
          "all_to_all: input {} and output {} elements must be equal and divisible by the group "
          "size {} (use all_to_all_v for other counts)",
          in.count, out.count, n));
  require_argument(in.data == nullptr || in.data != out.data,
                   "all_to_all: input and output must not alias");
  check_pair("all_to_all", in, out);
  const size_t block = in.count / static_cast<size_t>(n);
  const Resolved r = resolve(dev, g, opt, {OpKind::kAllToAll, in.count, opt.wire_elem(dev)});
  const Algo algo = r.algo;
  if (algo == Algo::kTree)
    return run_on_comm(dev, g, opt, &r.shape, algo, r.shape.proto,
                       [&](Ctx& c) { detail::bruck_all_to_all(c, in.data, out.data, block); });
  // The equal counts live after the four arrays all_to_all_v keeps there.
  std::vector<size_t>& idx = g.index_scratch();
  const auto un = static_cast<size_t>(n);
  if (idx.size() < 5 * un) idx.resize(5 * un);
  std::fill(idx.begin() + static_cast<long>(4 * un), idx.begin() + static_cast<long>(5 * un), block);
  const std::span<const size_t> counts(idx.data() + 4 * un, un);
  return iall_to_all_v(dev, g, in, counts, out, counts, CollOptions{algo, opt.after, opt.stream, opt.elem_size, r.shape.proto});
}

Work iall_to_all_v(Device& dev, const ProcessGroup& g, ConstBuffer in, std::span<const size_t> send_counts,
                   Buffer out, std::span<const size_t> recv_counts, const CollOptions& opt) {
  const auto n = static_cast<size_t>(g.size());
  require_argument(send_counts.size() == n && recv_counts.size() == n,
                   fmt::format("all_to_all_v: {} send and {} receive counts for a group of {}",
                               send_counts.size(), recv_counts.size(), n));
  const size_t sends = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
  const size_t recvs = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  require_argument(
      sends == in.count && recvs == out.count,
      fmt::format("all_to_all_v: counts sum to {} sent / {} received, buffers hold {} / {}", sends,
                  recvs, in.count, out.count));
  require_argument(in.data == nullptr || in.data != out.data || in.count == 0,
                   "all_to_all_v: input and output must not alias");
  require_argument(opt.algo != Algo::kTree,
                   "all_to_all_v: tree (Bruck) needs equal blocks; use direct or ring");
  check_pair("all_to_all_v", in, out);
  // Displacements: exclusive prefix sums, kept in the group's index scratch
  // after the counts (which may live there too: all_to_all passes them).
  std::vector<size_t>& idx = g.index_scratch();
  if (idx.size() < 5 * n) idx.resize(5 * n);  // never shrinks: see iall_to_all
  std::copy(send_counts.begin(), send_counts.end(), idx.begin());
  std::copy(recv_counts.begin(), recv_counts.end(), idx.begin() + static_cast<long>(n));
  std::exclusive_scan(idx.begin(), idx.begin() + static_cast<long>(n), idx.begin() + static_cast<long>(2 * n), size_t{0});
  std::exclusive_scan(idx.begin() + static_cast<long>(n), idx.begin() + static_cast<long>(2 * n),
                      idx.begin() + static_cast<long>(3 * n), size_t{0});
  const size_t *sc = idx.data(), *rc = sc + n, *sd = sc + 2 * n, *rd = sc + 3 * n;
  // Per-member counts: no shape for the tuner; Simple unless the caller says.
  Proto proto = opt.proto;
  if (proto == Proto::kAuto) proto = dev.profile().protocols.empty() ? Proto::kPlain : Proto::kSimple;
  // Equal blocks both ways (all_to_all, or a phantom MoE exchange under
  // uniform routing): the shape of an all_to_all, which a folded group
  // replays (folded.h); its members' counts are their representatives'.
  const bool equal = detail::has_folded_member(dev, g) &&
                     std::all_of(sc, sc + 2 * n, [&](size_t c) { return c == sc[0]; });
  const CollShape uniform{OpKind::kAllToAll, sc[0] * n, opt.wire_elem(dev), 0, proto};
  const Algo algo = opt.algo == Algo::kRing ? Algo::kRing : Algo::kDirect;  // what runs (kAuto: direct)
  return run_on_comm(dev, g, opt, equal ? &uniform : nullptr, algo, proto, [&](Ctx& c) {
    if (algo == Algo::kRing) return detail::pairwise_all_to_all_v(c, in.data, sd, sc, out.data, rd, rc);
    detail::direct_all_to_all_v(c, in.data, sd, sc, out.data, rd, rc);
  });
}

Work ibarrier(Device& dev, const ProcessGroup& g, const CollOptions& opt) {
  CollOptions tree = opt;
  tree.algo = Algo::kTree;
  const Resolved r = resolve(dev, g, tree, {OpKind::kBarrier, 0, opt.wire_elem(dev)});
  return run_on_comm(dev, g, opt, &r.shape, Algo::kTree, r.shape.proto,
                     [&](Ctx& c) { detail::dissemination_barrier(c); });
}

// ---- Blocking forms ---------------------------------------------------------

void all_reduce(Device& dev, const ProcessGroup& g, Buffer data, ReduceOp op, const CollOptions& opt) {
  iall_reduce(dev, g, data, data, op, opt).wait(dev.compute());
}
void all_reduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, ReduceOp op, const CollOptions& opt) {
  iall_reduce(dev, g, in, out, op, opt).wait(dev.compute());
}
void reduce_scatter(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, ReduceOp op,
                    const CollOptions& opt) {
  ireduce_scatter(dev, g, in, out, op, opt).wait(dev.compute());
}
void all_gather(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, const CollOptions& opt) {
  iall_gather(dev, g, in, out, opt).wait(dev.compute());
}
void broadcast(Device& dev, const ProcessGroup& g, Buffer data, int root, const CollOptions& opt) {
  ibroadcast(dev, g, data, root, opt).wait(dev.compute());
}
void reduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, int root, ReduceOp op,
            const CollOptions& opt) {
  ireduce(dev, g, in, out, root, op, opt).wait(dev.compute());
}
void all_to_all(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, const CollOptions& opt) {
  iall_to_all(dev, g, in, out, opt).wait(dev.compute());
}
void all_to_all_v(Device& dev, const ProcessGroup& g, ConstBuffer in, std::span<const size_t> send_counts,
                  Buffer out, std::span<const size_t> recv_counts, const CollOptions& opt) {
  iall_to_all_v(dev, g, in, send_counts, out, recv_counts, opt).wait(dev.compute());
}
void barrier(Device& dev, const ProcessGroup& g, const CollOptions& opt) {
  ibarrier(dev, g, opt).wait(dev.compute());
}

}  // namespace shardlab::collectives
