// DeepEP's dispatcher: tokens cross to each node once (ep_node_dispatch.h).
#include "model/parallel/expert/ep_node_dispatch.h"

#include <algorithm>
#include <numeric>

#include "model/parallel/expert/ep_exchange.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

using model::BlockView;
using model::Exec;
using model::GPTConfig;

namespace coll = collectives;

MoeDispatcher parse_moe_dispatcher(const std::string& text) {
  if (text == "alltoall") return MoeDispatcher::kAllToAll;
  if (text == "deepep") return MoeDispatcher::kDeepEp;
  throw ConfigError("`moe_dispatcher` must be alltoall or deepep (got '" + text + "')");
}

const char* moe_dispatcher_name(MoeDispatcher d) { return d == MoeDispatcher::kDeepEp ? "deepep" : "alltoall"; }

EpNodes ep_nodes(const std::vector<int>& members, int devices_per_node) {
  EpNodes r;
  const int P = static_cast<int>(members.size());
  int L = 0;
  while (L < P && members[size_t(L)] / devices_per_node == members[0] / devices_per_node) ++L;
  std::vector<int> seen;  // the nodes of the runs so far
  for (int j = 0; j < P; ++j) {
    const int b = j / L, node = members[size_t(j)] / devices_per_node;
    const bool same = P % L == 0 && node == members[size_t(b * L)] / devices_per_node;
    const bool fresh = j % L != 0 || std::find(seen.begin(), seen.end(), node) == seen.end();
    if (j % L == 0) seen.push_back(node);
    if (!same || !fresh) {
      r.error = "its " + std::to_string(P) + " ranks do not sit on nodes in equal consecutive runs (" +
                std::to_string(L) + " on the first node)";
      return r;
    }
  }
  r.nodes = P / L;
  r.per_node = L;
  return r;
}

std::vector<int> ep_node_members(const std::vector<int>& members, int per_node, int me) {
  const auto it = std::find(members.begin(), members.end(), me);
  const int j = static_cast<int>(it - members.begin()), b = j / per_node;
  return {members.begin() + b * per_node, members.begin() + (b + 1) * per_node};
}

std::vector<int> ep_rail_members(const std::vector<int>& members, int per_node, int me) {
  const auto it = std::find(members.begin(), members.end(), me);
  const int l = static_cast<int>(it - members.begin()) % per_node;
  std::vector<int> rail;
  for (size_t j = size_t(l); j < members.size(); j += size_t(per_node)) rail.push_back(members[j]);
  return rail;
}

namespace {

// The exchange sizes of `rows` rows of `width` floats.
void widths(const std::vector<size_t>& rows, size_t width, std::vector<size_t>& out) {
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * width;
}

// What the source sends each node: per node b, its tokens with an expert
// there (a.node.tokens in real math, node-major, each once, in token order) and the counts a.node.send_counts
// [b·(1+En)]: the tokens, then the rows per expert of the node. A phantom
// run with local routing (`local`: the plan is a function of the shapes,
// moe.h phantom_plan) computes the same counts from it once per host
// thread, between two waits (runtime/fiber.h).
void plan_source(TpMoeActs& a, int64_t N, int K, int Nn, int En, bool math, bool local) {
  TpMoeActs::Node& nd = a.node;
  const int S = 1 + En;
  struct Known {
    const int64_t* routed = nullptr;
    int64_t M = -1, N = 0, K = 0, Nn = 0, En = 0, sum = 0;
    std::vector<float> counts;
    std::vector<int64_t> offsets;
  };
  thread_local Known known;
  int64_t sum = 0;  // the plan's fingerprint: its expert offsets
  for (int64_t e = 0; e <= int64_t{Nn} * En; ++e) sum = sum * 31 + a.offsets[e];
  if (!math && local && known.routed == a.routed && known.M == a.M && known.N == N && known.K == K && known.Nn == Nn &&
      known.En == En && known.sum == sum) {
    std::copy(known.counts.begin(), known.counts.end(), nd.send_counts.data());
    std::copy(known.offsets.begin(), known.offsets.end(), nd.token_offsets.data());
    nd.sent = nd.token_offsets[Nn];
    return;
  }
  thread_local std::vector<int32_t> last;  // the last node a token was counted for
  last.assign(size_t(N), -1);
  thread_local std::vector<int64_t> counts;  // reused: no allocation per layer and micro-batch
  counts.assign(size_t(Nn) * S, 0);
  int64_t t = 0;
  for (int b = 0; b < Nn; ++b) {
    nd.token_offsets[b] = t;
    for (int j = 0; j < En; ++j) {
      const int64_t e = int64_t{b} * En + j;
      counts[size_t(b) * S + 1 + j] = a.offsets[e + 1] - a.offsets[e];
      for (int64_t m = a.offsets[e]; m < a.offsets[e + 1]; ++m) {
        const int64_t n = a.routed[m] / K;
        if (last[size_t(n)] == b) continue;
        last[size_t(n)] = b;
        ++counts[size_t(b) * S];
      }
    }
    // In token order, as each expert's rows are (moe_plan): every expert
    // then meets its tokens in the all-to-all's order.
    if (math)
      for (int64_t n = 0; n < N; ++n)
        if (last[size_t(n)] == b) nd.tokens[t++] = n;
    if (!math) t += counts[size_t(b) * S];
  }
  nd.token_offsets[Nn] = nd.sent = t;
  for (size_t i = 0; i < counts.size(); ++i) nd.send_counts[i] = static_cast<float>(counts[i]);
  if (math || !local) return;
  known = {a.routed, a.M, N, K, Nn, En, sum, std::vector<float>(nd.send_counts.data(), nd.send_counts.data() + counts.size()),
           std::vector<int64_t>(nd.token_offsets.data(), nd.token_offsets.data() + Nn + 1)};
}

}  // namespace

float ep_node_moe_forward(float* out, TpMoeActs& a, MoeScratch& s, const BlockView<float>& p, const float* inp,
                          const ShardDims& d, const GPTConfig& config, const ExpertContext& c) {
  const Exec& ex = c.ex;
  const coll::ProcessGroup &rail = *c.ep_rail, &node = *c.ep_node;
  const int C = d.C, E = config.n_expert, K = config.top_k, El = E / c.ep->size();
  const int Nn = rail.size(), L = node.size(), En = L * El, S = 1 + En, W = C + 2 * K;
  const int64_t N = d.moe_rows();
  SHARDLAB_CHECK(static_cast<int>(p.experts.size()) == El, "EP block must hold E/ep experts");
  SHARDLAB_CHECK(Nn * L == c.ep->size(), "the node and rail groups must tile the EP group");
  tp_moe_route(a, p, inp, d, config, c);
  a.stats.a2a_sent_bytes = a.stats.a2a_recv_bytes = a.stats.a2a_internode_sent_bytes = 0;
  TpMoeActs::Node& nd = a.node;
  TpMoeActs::Ep& x = a.ep;
  plan_source(a, N, K, Nn, En, ex.math(), !c.global_routing());
  // The counts to each node's relay (tokens, rows per expert of the node).
  Stream& st = c.dev->compute();
  Time t0 = st.now();
  coll::all_to_all(*c.dev, rail, coll::ConstBuffer(nd.send_counts.data(), size_t(Nn) * S),
                   coll::Buffer(nd.recv_counts.data(), size_t(Nn) * S), c.on_compute());
  st.mark("moe.counts.a2a.rail", t0, st.now(), 0, -1, /*advance=*/false);
  if (c.a2a_time) *c.a2a_time += st.now() - t0;
  if (c.dev->folding() && !ex.math())  // as plan_rows: every source sends a node what I send mine
    for (int i = 0; i < Nn; ++i)
      for (int j = 0; j < S; ++j) nd.recv_counts[i * S + j] = nd.send_counts[rail.rank() * S + j];
  nd.U = 0;
  for (int b = 0; b < Nn; ++b) {
    nd.rail_send[size_t(b)] = size_t(nd.send_counts[b * S]);
    nd.rail_recv[size_t(b)] = size_t(nd.recv_counts[b * S]);
    nd.U += int64_t(nd.rail_recv[size_t(b)]);
  }
  // Source: each token once per node, with its choices there and their gates.
  float* packed = s.node_src.data();
  ex.run("moe.dispatch.pack", OpCost{0, static_cast<double>(nd.sent) * (C + W) * ex.elem}, [&] {
    for (int b = 0; b < Nn; ++b) {
      for (int64_t t = nd.token_offsets[b]; t < nd.token_offsets[b + 1]; ++t) {
        float* row = packed + t * W;
        std::copy_n(inp + nd.tokens[t] * C, C, row);
        std::fill(row + C, row + C + K, -1.0f);
        std::fill(row + C + K, row + W, 0.0f);
      }
      // each choice of node b's experts into its token's row
      thread_local std::vector<int64_t> row_of;
      row_of.resize(size_t(N));
      for (int64_t t = nd.token_offsets[b]; t < nd.token_offsets[b + 1]; ++t) row_of[size_t(nd.tokens[t])] = t;
      for (int64_t e = int64_t{b} * En; e < int64_t{b + 1} * En; ++e)
        for (int64_t m = a.offsets[e]; m < a.offsets[e + 1]; ++m) {
          const int64_t n = a.routed[m] / K, k = a.routed[m] % K;
          float* row = packed + row_of[size_t(n)] * W;
          row[C + k] = static_cast<float>(e);
          row[C + K + k] = a.gates[a.routed[m]];
        }
    }
  });
  std::vector<size_t>&sc = nd.node_send, &rc = nd.node_recv;
  // The rail exchanges' sizes live on the device (a fiber's thread-locals
  // are its host thread's, and a collective waits: runtime/fiber.h).
  std::vector<size_t>&rs = s.rail_send, &rr = s.rail_recv;
  rs.resize(size_t(Nn));
  rr.resize(size_t(Nn));
  widths(nd.rail_send, size_t(W), rs);
  widths(nd.rail_recv, size_t(W), rr);
  float* relay = s.node_relay.data();
  exchange_rows(c, rail, "moe.dispatch.a2a.rail", packed, rs, relay, rr, &a.stats);
  // Relay: one row per (token, expert of this node), grouped by owner and
  // expert (then source node and token), for the node exchange.
  const int64_t first_expert = int64_t{rail.rank()} * En;
  nd.Rn = 0;
  thread_local std::vector<int64_t> pos;
  pos.resize(size_t(En));
  for (int j = 0; j < En; ++j) {
    int64_t rows = 0;
    for (int i = 0; i < Nn; ++i) rows += int64_t(nd.recv_counts[i * S + 1 + j]);
    x.send_rows[j] = static_cast<float>(rows);
    pos[size_t(j)] = nd.Rn;
    nd.Rn += rows;
  }
  float* xr = s.ep_yl.data();  // free until the experts' outputs
  ex.run("moe.dispatch.expand", OpCost{0, (static_cast<double>(nd.U) * W + double(nd.Rn) * C) * ex.elem}, [&] {
    for (int64_t u = 0; u < nd.U; ++u) {
      const float* row = relay + u * W;
      for (int k = 0; k < K; ++k) {
        if (row[C + k] < 0) continue;
        const int64_t j = static_cast<int64_t>(row[C + k]) - first_expert;
        SHARDLAB_CHECK(j >= 0 && j < En, "a relayed token names an expert of another node");
        const int64_t r = pos[size_t(j)]++;
        std::copy_n(row, C, xr + r * C);
        nd.row_token[r] = u;
        nd.row_slot[r] = k;
        nd.row_gate[r] = row[C + K + k];
      }
    }
  });
  // The node's owners: their experts, as ep_dispatch.cc runs them.
  plan_rows(x, a.stats, node, El, C, sc, rc, "moe.counts.a2a.node", c);
  exchange_rows(c, node, "moe.dispatch.a2a.node", xr, sc, s.ep_xr.data(), rc, &a.stats);
  permute_rows(x.xl.data(), s.ep_xr.data(), x.perm.data(), x.R, C, true, "moe.permute.fwd", ex);
  tp_experts_forward(s.ep_yl.data(), a.fc.data(), a.fc_gelu.data(), p.experts, x.xl.data(), x.offsets.data(), El,
                     expert_fl(d, config), d, c, config.is_llama());
  permute_rows(s.ep_xr.data(), s.ep_yl.data(), x.perm.data(), x.R, C, false, "moe.unpermute.fwd", ex);
  exchange_rows(c, node, "moe.combine.a2a.node", s.ep_xr.data(), rc, nd.y.data(), sc, &a.stats);
  // Relay: each token's gate-weighted sum over this node's experts, one row back.
  ex.run("moe.combine.relay", OpCost{2.0 * double(nd.Rn) * C, (double(nd.Rn) + double(nd.U)) * C * ex.elem}, [&] {
    std::fill(relay, relay + nd.U * C, 0.0f);
    for (int64_t r = 0; r < nd.Rn; ++r) {
      float* o = relay + nd.row_token[r] * C;
      const float g = nd.row_gate[r];
      const float* y = nd.y.data() + r * C;
      for (int k = 0; k < C; ++k) o[k] += g * y[k];
    }
  });
  widths(nd.rail_send, size_t(C), rs);
  widths(nd.rail_recv, size_t(C), rr);
  exchange_rows(c, rail, "moe.combine.a2a.rail", relay, rr, packed, rs, &a.stats);
  // Source: the sum over the nodes.
  ex.run("moe.combine.fwd", OpCost{double(nd.sent) * C, (double(N) * C * 2 + double(nd.sent) * C) * ex.elem}, [&] {
    std::fill(out, out + N * C, 0.0f);
    for (int64_t t = 0; t < nd.sent; ++t) {
      float* o = out + nd.tokens[t] * C;
      const float* y = packed + t * C;
      for (int k = 0; k < C; ++k) o[k] += y[k];
    }
  });
  tp_shared_experts_forward(out, a, p, inp, d, config, c);
  return a.aux;
}

void ep_node_moe_backward(float* dexperts, float* drouter, const BlockView<float>& g, MoeScratch& s, const float* dout,
                          float daux, const TpMoeActs& a, const float* inp, const BlockView<float>& p,
                          const ShardDims& d, const GPTConfig& config, WeightGrads& wg, const ExpertContext& c) {
  const Exec& ex = c.ex;
  const coll::ProcessGroup &rail = *c.ep_rail, &node = *c.ep_node;
  const int C = d.C, K = config.top_k, El = config.n_expert / c.ep->size();
  const int Nn = rail.size(), G = C + K;
  const int64_t N = d.moe_rows();
  const TpMoeActs::Node& nd = a.node;
  const TpMoeActs::Ep& x = a.ep;
  WeightGrads& ewg = experts_wgrad(c, wg);
  tp_shared_experts_backward(dexperts, g, s, dout, a, inp, p, d, config, ewg, ex);
  // dout once to each relay
  float* packed = s.node_src.data();
  float* relay = s.node_relay.data();
  ex.run("moe.combine.bwd.pack", OpCost{0, 2.0 * double(nd.sent) * C * ex.elem}, [&] {
    for (int64_t t = 0; t < nd.sent; ++t) std::copy_n(dout + nd.tokens[t] * C, C, packed + t * C);
  });
  std::vector<size_t>&rs = s.rail_send, &rr = s.rail_recv;  // on the device, as in forward
  rs.resize(size_t(Nn));
  rr.resize(size_t(Nn));
  widths(nd.rail_send, size_t(C), rs);
  widths(nd.rail_recv, size_t(C), rr);
  exchange_rows(c, rail, "moe.combine.a2a.rail.bwd", packed, rs, relay, rr, nullptr);
  // Relay: dye = gate · dout for every relayed row, dgate = dout · y.
  float* dgate = relay + nd.U * G;  // after the rows it returns below (C + 2K floats a token fit both)
  float* dye = s.ep_yl.data();
  ex.run("moe.combine.relay.bwd", OpCost{4.0 * double(nd.Rn) * C, (double(nd.U) + 2.0 * double(nd.Rn)) * C * ex.elem},
         [&] {
           std::fill(dgate, dgate + nd.U * K, 0.0f);
           for (int64_t r = 0; r < nd.Rn; ++r) {
             const float* dd = relay + nd.row_token[r] * C;
             const float* y = nd.y.data() + r * C;
             float* dy = dye + r * C;
             const float gr = nd.row_gate[r];
             float dg = 0;
             for (int k = 0; k < C; ++k) {
               dy[k] = gr * dd[k];
               dg += dd[k] * y[k];
             }
             dgate[nd.row_token[r] * K + nd.row_slot[r]] += dg;
           }
         });
  exchange_rows(c, node, "moe.combine.a2a.node.bwd", dye, nd.node_send, s.ep_xr.data(), nd.node_recv, nullptr);
  permute_rows(s.ep_yl.data(), s.ep_xr.data(), x.perm.data(), x.R, C, true, "moe.permute.bwd", ex);
  tp_experts_backward(s.ep_xr.data(), g.experts, s, s.ep_yl.data(), x.xl.data(), a.fc.data(), a.fc_gelu.data(),
                      p.experts, x.offsets.data(), El, expert_fl(d, config), d, ewg, ex, config.is_llama());
  permute_rows(s.ep_yl.data(), s.ep_xr.data(), x.perm.data(), x.R, C, false, "moe.unpermute.bwd", ex);
  exchange_rows(c, node, "moe.dispatch.a2a.node.bwd", s.ep_yl.data(), nd.node_recv, s.ep_xr.data(), nd.node_send,
                nullptr, [&] { run_delayed_wgrad(c); });
  // Relay: each token's input gradient summed over this node's experts, with its dgates.
  ex.run("moe.dispatch.relay.bwd", OpCost{double(nd.Rn) * C, (double(nd.Rn) * C + double(nd.U) * G) * ex.elem}, [&] {
    for (int64_t u = 0; u < nd.U; ++u) {
      std::fill(relay + u * G, relay + u * G + C, 0.0f);
      std::copy_n(dgate + u * K, K, relay + u * G + C);  // dgate sits after every row: no overlap ahead of u
    }
    for (int64_t r = 0; r < nd.Rn; ++r) {
      float* o = relay + nd.row_token[r] * G;
      const float* dx = s.ep_xr.data() + r * C;
      for (int k = 0; k < C; ++k) o[k] += dx[k];
    }
  });
  widths(nd.rail_send, size_t(G), rs);
  widths(nd.rail_recv, size_t(G), rr);
  exchange_rows(c, rail, "moe.dispatch.a2a.rail.bwd", relay, rr, packed, rs, nullptr);
  // Source: the nodes' input gradients summed into dexperts, the dgates in place.
  ex.run("moe.dispatch.bwd", OpCost{double(nd.sent) * C, (double(nd.sent) * G + 2.0 * double(N) * C) * ex.elem}, [&] {
    std::fill(s.dgates.begin(), s.dgates.begin() + N * K, 0.0f);
    for (int64_t t = 0; t < nd.sent; ++t) {
      const int64_t n = nd.tokens[t];
      float* o = dexperts + n * C;
      const float* row = packed + t * G;
      for (int k = 0; k < C; ++k) o[k] += row[k];
      for (int k = 0; k < K; ++k) s.dgates[n * K + k] += row[C + k];
    }
  });
  tp_moe_router_backward(drouter, g, s, daux, a, inp, p, d, config, wg, ex);
}

}  // namespace shardlab::parallel
