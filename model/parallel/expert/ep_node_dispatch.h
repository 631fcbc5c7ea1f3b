// DeepEP's dispatcher for expert parallelism across nodes (--moe-dispatcher
// deepep; the shape of DeepEP's internode kernels and of Megatron-core's flex
// dispatcher with HybridEP). Megatron's all-to-all dispatcher
// (ep_dispatch.h) sends one row per (token, expert): a token whose K experts
// sit on four other nodes crosses the network K times, and K rows come back.
// Here a token crosses to each node holding one of its experts once, and one
// row comes back from it:
//
//   route (as tp_moe_route)
//   -> rail exchange ("moe.dispatch.a2a.rail"): to the rank at this device's
//      place on each such node (its relay), the token once, with its choices
//      on that node and their gates (C + 2K floats a row)
//   -> the relay expands each token into one row per (token, expert of its
//      node) ("moe.dispatch.expand") and hands them to their owners over
//      NVLink ("moe.dispatch.a2a.node")
//   -> the owners' experts, as in ep_dispatch.h; their outputs back to the
//      relay ("moe.combine.a2a.node")
//   -> the relay sums the gate-weighted outputs of each token
//      ("moe.combine.relay") and sends one row back ("moe.combine.a2a.rail")
//   -> the source sums its nodes' rows ("moe.combine.fwd").
//
// Backward mirrors it: dout once to each relay, gate · dout to the owners and
// dgate = dout · y at the relay, the experts' input gradients summed per
// token at the relay and returned once with the token's dgates.
//
// The group's ranks sit on Nn nodes, L on each, EP rank b·L + l on node b at
// place l (ep_nodes() checks a layout); ExpertContext::ep_rail (size Nn) and
// ep_node (size L) are the exchanges' groups. The math is the all-to-all
// dispatcher's with the gate-weighted sum split into a sum per node (each in
// expert order) and a sum over nodes: bit-identical on one node, within
// rounding across nodes. The counts steer a phantom run the same way
// (uniform phantom routing is the same on every rank, so a folded run
// reads its peers' counts off its own).
// Thread safety: called from the device's own thread, like the collectives.
#pragma once

#include <string>
#include <vector>

#include "model/parallel/expert/moe.h"

namespace shardlab::parallel {

// Which dispatcher moves the tokens of expert parallelism: Megatron's
// all-to-all (ep_dispatch.h) or DeepEP's (this file).
enum class MoeDispatcher { kAllToAll, kDeepEp };
MoeDispatcher parse_moe_dispatcher(const std::string& text);  // ConfigError on anything else
const char* moe_dispatcher_name(MoeDispatcher d);

// How an EP group's members (global ranks, in EP order) sit on nodes of
// `devices_per_node`: `nodes` nodes of `per_node` consecutive members each,
// or `error` saying why they do not.
struct EpNodes {
  int nodes = 0, per_node = 0;
  std::string error;
};
EpNodes ep_nodes(const std::vector<int>& members, int devices_per_node);
// The members on `me`'s node (its node group) and at its place on every node
// (its rail group), for a layout ep_nodes accepted.
std::vector<int> ep_node_members(const std::vector<int>& members, int per_node, int me);
std::vector<int> ep_rail_members(const std::vector<int>& members, int per_node, int me);

// Same contract as ep_moe_forward / ep_moe_backward (ep_dispatch.h), with
// c.node_dispatch().
float ep_node_moe_forward(float* out, TpMoeActs& a, MoeScratch& s, const model::BlockView<float>& p,
                          const float* inp, const ShardDims& d, const model::GPTConfig& config,
                          const ExpertContext& c);
void ep_node_moe_backward(float* dexperts, float* drouter, const model::BlockView<float>& g, MoeScratch& s,
                          const float* dout, float daux, const TpMoeActs& a, const float* inp,
                          const model::BlockView<float>& p, const ShardDims& d, const model::GPTConfig& config,
                          WeightGrads& wg, const ExpertContext& c);

}  // namespace shardlab::parallel
