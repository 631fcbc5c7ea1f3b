// Expert-parallel MoE: the token exchange around the local experts.
// Shapes use the letters declared in expert/ep_dispatch.h.
#include "model/parallel/expert/ep_dispatch.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "model/kernels.h"
#include "model/parallel/expert/ep_exchange.h"
#include "runtime/errors.h"
#include "runtime/fiber.h"

namespace shardlab::parallel {

using model::BlockView;
using model::Exec;
using model::GPTConfig;

namespace coll = collectives;

namespace {

size_t sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

}  // namespace

void plan_rows(TpMoeActs::Ep& x, MoeStats& stats, const coll::ProcessGroup& g, int El, int C,
               std::vector<size_t>& send_elems, std::vector<size_t>& recv_elems, const char* name,
               const ExpertContext& c) {
  const int P = g.size();
  Stream& s = c.dev->compute();
  const Time t0 = s.now();
  coll::all_to_all(*c.dev, g, coll::ConstBuffer(x.send_rows.data(), size_t(P) * El),
                   coll::Buffer(x.recv_rows.data(), size_t(P) * El), c.on_compute());
  s.mark(name, t0, s.now(), 0, -1, /*advance=*/false);
  if (c.a2a_time) *c.a2a_time += s.now() - t0;
  // A folded phantom run moves no data to or from the ranks it plays
  // (model/engine/fold.h), and needs none: phantom routing is a function of
  // (N, E, K, capacity, zipf) alone, the same on every rank, so peer i
  // sends my local expert le what I send my own peer index's expert le.
  if (c.dev->folding() && !c.ex.math())
    for (int i = 0; i < P; ++i)
      for (int le = 0; le < El; ++le) x.recv_rows[i * El + le] = x.send_rows[g.rank() * El + le];
  auto rows = [&](int peer, int le) { return static_cast<int64_t>(x.recv_rows[peer * El + le]); };
  for (int j = 0; j < P; ++j) {
    int64_t out = 0, in = 0;
    for (int le = 0; le < El; ++le) out += static_cast<int64_t>(x.send_rows[j * El + le]), in += rows(j, le);
    send_elems[j] = size_t(out) * size_t(C);
    recv_elems[j] = size_t(in) * size_t(C);
  }
  x.offsets[0] = 0;
  for (int le = 0; le < El; ++le) {
    int64_t r = 0;
    for (int i = 0; i < P; ++i) r += rows(i, le);
    x.offsets[le + 1] = x.offsets[le] + r;
    stats.received[le] = r;
  }
  x.R = x.offsets[El];
  if (!c.ex.math()) return;  // the order moves rows only (moe_buffers.cc: no perm in a phantom run)
  int64_t row = 0;  // expert-major
  for (int le = 0; le < El; ++le) {
    int64_t peer_first = 0;  // first received row of peer i
    for (int i = 0; i < P; ++i) {
      int64_t first = peer_first;
      for (int k = 0; k < le; ++k) first += rows(i, k);
      for (int64_t r = 0; r < rows(i, le); ++r) x.perm[row++] = first + r;
      peer_first += static_cast<int64_t>(recv_elems[i]) / C;
    }
  }
}

void run_delayed_wgrad(const ExpertContext& c) {
  if (c.delayed_wgrad) c.delayed_wgrad->flush(c.ex, {});
}

void exchange_rows(const ExpertContext& c, const coll::ProcessGroup& g, const char* name, const float* in,
                   const std::vector<size_t>& sc, float* out, const std::vector<size_t>& rc, MoeStats* stats,
                   const std::function<void()>& meanwhile) {
  Stream& compute = c.dev->compute();
  Stream& s = c.a2a_stream ? *c.a2a_stream : compute;
  if (c.a2a_stream) s.wait(compute.record());  // the rows exist once the compute stream made them
  const Time t0 = s.now();
  coll::CollOptions on = c.on_compute();
  on.stream = &s;
  // The rows move at the call; the compute stream waits for their virtual
  // arrival below (at once, or after the other program's turn).
  const coll::Work work =
      coll::iall_to_all_v(*c.dev, g, coll::ConstBuffer(in, sum(sc)), sc, coll::Buffer(out, sum(rc)), rc, on);
  uint64_t sent = 0, received = 0, internode = 0;
  const HardwareProfile& profile = c.dev->profile();
  for (int j = 0; j < g.size(); ++j) {
    if (j == g.rank()) continue;
    sent += uint64_t(sc[j]) * uint64_t(c.ex.elem);
    received += uint64_t(rc[j]) * uint64_t(c.ex.elem);
    if (profile.node_of(g.global_rank(j)) != c.dev->node()) internode += uint64_t(sc[j]) * uint64_t(c.ex.elem);
  }
  s.mark(name, t0, s.now(), sent, -1, /*advance=*/false);
  if (meanwhile) meanwhile();
  if (c.a2a_stream) {
    // The other micro-batch's program runs until its own next exchange; the
    // received rows are here already (the data moved at the call), their
    // virtual arrival is the work's event.
    Interleave::yield();
    const Time before = compute.now();
    work.wait(compute);
    if (c.a2a_time) *c.a2a_time += compute.now() - before;  // what the compute stream still waited
  } else {
    work.wait(compute);
    if (c.a2a_time) *c.a2a_time += s.now() - t0;
  }
  if (!stats) return;
  stats->a2a_sent_bytes += sent;
  stats->a2a_recv_bytes += received;
  stats->a2a_internode_sent_bytes += internode;
}

void permute_rows(float* dst, const float* src, const int64_t* perm, int64_t R, int C,
                  bool to_expert_major, const char* name, const Exec& ex) {
  ex.run(name, OpCost{0, 2.0 * static_cast<double>(R) * C * ex.elem}, [&] {
    for (int64_t m = 0; m < R; ++m) {
      const int64_t from = to_expert_major ? perm[m] : m, to = to_expert_major ? m : perm[m];
      std::copy_n(src + from * C, C, dst + to * C);
    }
  });
}

float ep_moe_forward(float* out, TpMoeActs& a, MoeScratch& s, const BlockView<float>& p,
                     const float* inp, const ShardDims& d, const GPTConfig& config,
                     const ExpertContext& c) {
  const Exec& ex = c.ex;
  const int C = d.C, E = config.n_expert, El = E / c.ep->size();
  SHARDLAB_CHECK(static_cast<int>(p.experts.size()) == El, "EP block must hold E/ep experts");
  tp_moe_route(a, p, inp, d, config, c);
  tp_moe_dispatch(a, inp, d, config, ex);  // rows grouped by expert, hence by owning rank
  a.stats.a2a_sent_bytes = a.stats.a2a_recv_bytes = a.stats.a2a_internode_sent_bytes = 0;
  TpMoeActs::Ep& x = a.ep;
  for (int e = 0; e < E; ++e) x.send_rows[e] = static_cast<float>(a.offsets[e + 1] - a.offsets[e]);
  plan_rows(x, a.stats, *c.ep, El, C, x.send_elems, x.recv_elems, "moe.counts.a2a", c);
  exchange_rows(c, *c.ep, "moe.dispatch.a2a", a.xe.data(), x.send_elems, s.ep_xr.data(), x.recv_elems,
                &a.stats);
  permute_rows(x.xl.data(), s.ep_xr.data(), x.perm.data(), x.R, C, true, "moe.permute.fwd", ex);
  tp_experts_forward(s.ep_yl.data(), a.fc.data(), a.fc_gelu.data(), p.experts, x.xl.data(),
                     x.offsets.data(), El, expert_fl(d, config), d, c, config.is_llama());
  permute_rows(s.ep_xr.data(), s.ep_yl.data(), x.perm.data(), x.R, C, false, "moe.unpermute.fwd",
               ex);
  exchange_rows(c, *c.ep, "moe.combine.a2a", s.ep_xr.data(), x.recv_elems, a.ye.data(), x.send_elems,
                &a.stats);
  const float aux = tp_moe_combine(out, a, d, config, ex);
  tp_shared_experts_forward(out, a, p, inp, d, config, c);
  return aux;
}

void ep_moe_backward(float* dexperts, float* drouter, const BlockView<float>& g, MoeScratch& s,
                     const float* dout, float daux, const TpMoeActs& a, const float* inp,
                     const BlockView<float>& p, const ShardDims& d, const GPTConfig& config,
                     WeightGrads& wg, const ExpertContext& c) {
  const Exec& ex = c.ex;
  const int C = d.C, El = config.n_expert / c.ep->size();
  const TpMoeActs::Ep& x = a.ep;
  WeightGrads& ewg = experts_wgrad(c, wg);
  tp_shared_experts_backward(dexperts, g, s, dout, a, inp, p, d, config, ewg, ex);
  tp_moe_combine_backward(s, dout, a, d, config, ex);
  // dye to the experts' owners, expert-major
  exchange_rows(c, *c.ep, "moe.combine.a2a.bwd", s.dye.data(), x.send_elems, s.ep_xr.data(), x.recv_elems,
                nullptr);
  permute_rows(s.ep_yl.data(), s.ep_xr.data(), x.perm.data(), x.R, C, true, "moe.permute.bwd", ex);
  // experts: partial input gradients over TP (summed by the caller after dispatch)
  tp_experts_backward(s.ep_xr.data(), g.experts, s, s.ep_yl.data(), x.xl.data(), a.fc.data(),
                      a.fc_gelu.data(), p.experts, x.offsets.data(), El, expert_fl(d, config), d, ewg, ex,
                      config.is_llama());
  permute_rows(s.ep_yl.data(), s.ep_xr.data(), x.perm.data(), x.R, C, false, "moe.unpermute.bwd",
               ex);
  // dxe back to the tokens' ranks, in the local plan's order
  exchange_rows(c, *c.ep, "moe.dispatch.a2a.bwd", s.ep_yl.data(), x.recv_elems, s.dxe.data(), x.send_elems,
                nullptr, [&] { run_delayed_wgrad(c); });
  tp_moe_route_backward(dexperts, drouter, g, s, daux, a, inp, p, d, config, wg, ex);
}

}  // namespace shardlab::parallel
