// Folding: which ranks of a phantom run one thread can play for the others.
//
// In a phantom run (train's TrainOptions::phantom, serve's ReplicaShape)
// ranks that are provably symmetric run the same program from the same
// state, so one thread, the representative, plays them all: its collectives
// over folded members are replayed on the link model as if they were there
// (collectives/folded.h), and every folded rank reports its
// representative's figures.
//
//   data parallelism is folded (every dp rank played by dp rank 0) when
//     every dp rank owns as many elements as its peers (without ZeRO; with
//     ZeRO-1/2, whose buckets are padded to a multiple of their group as
//     Megatron pads them, always: every per-rank collective moves the
//     padded chunk, the tied wte's pipeline sum too, so a rank whose chunk
//     holds padding sends as much as one whose chunk is all real; with
//     ZeRO-3 when every bucket divides evenly by its group: the chunks then differ in which elements, not in
//     sizes, so every collective, optimizer kernel and allocation is the
//     same; FoldInput::uneven_chunks),
//     the ep ranks among them too when phantom routing loads every expert
//     alike (FoldInput::routes_alike: their experts differ in which
//     weights, not in rows, so the all-to-alls have equal blocks);
//   tensor parallelism is folded (every tp rank by tp rank 0) for dense
//     models (the MoE router and experts are left unfolded);
//   context parallelism's ranks are folded (every cp rank played by cp
//     rank 0) for dense models under the ring (--cp-comm ring) when no
//     ZeRO chunk is uneven: the load-balanced split (chunks i and 2cp-1-i)
//     gives every cp rank the same chunk-pair kernels in the same order
//     (cp_attention.h), so the ranks differ in which tokens only. Their
//     groups' links must be uniform as dp's (below); a cp group over
//     several nodes with several members on each folds by place at once
//     (its ring's hops inside and between nodes differ by position: cp 4
//     on two nodes sends over NVLink from cp ranks 0 and 2, over the NIC
//     from 1 and 3). The ring's point-to-point transfers are not
//     collectives: the representative sends its own block (booking its
//     egress as the unfolded run) and hands the same message to the
//     running receivers of the members it plays (CpAttention::fold,
//     Device::isend_folded); before the first transfer every device checks
//     that each rank it plays sends and receives over its own links, from
//     a predecessor played by the same device as its own predecessor, and
//     fails with a FoldingError otherwise;
//   a dimension is folded only when its groups' links are uniform: all
//     members in one node, each member on a node of its own, or the same
//     local GPUs on each of several nodes (a dp group of 16 nodes x 8 GPUs:
//     every member has 7 peers on NVLink and the same rail to the others);
//     with expert parallelism the ep and edp groups too. Over several nodes
//     all dp ranks fold onto one first; if a collective then turns out
//     asymmetric (members at other local places send over other links
//     first), each folds onto the member at its own local place on its
//     group's first node (FoldPlan::by_place): the two differ by whole
//     nodes only (the replay still checks every collective);
//   when dp and tp are folded and a collective over a group holding both
//     (the global norm's over tp-dp where the gradients are
//     reduce-scattered) ends apart for tp peers (members at other places
//     in a node take their peers over NVLink and the NIC in another
//     order), dp stays folded without tp: a
//     representative per tp rank (per local place), each playing the
//     members at its place on the group's other nodes, which end as it
//     does; only then tp alone, then nothing (weaker());
//
// The replay checks symmetry at every folded collective (every folded
// member must end exactly where its representative ends) and fails
// otherwise, so folding never changes a reported figure. Whether a run may
// fold at all (a phantom run, without injected faults) is the caller's.
#pragma once

#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "runtime/profile.h"

namespace shardlab::engine {

struct FoldPlan {
  bool dp = false, tp = false, cp = false;
  // cp groups span several nodes with several members on each: each cp
  // rank is played by the member at its local place on its group's first
  // node (cp rank i by cp rank i mod m, m members a node).
  bool cp_by_place = false;
  // weaker() dropped tp before cp or dp (tp peers' collectives can end
  // apart where dp's and cp's do not, as the 405B rows' direct all-gathers
  // over tp-cp-dp and Megatron-core's norm all-gathers over tp-dp do);
  // dropping cp or dp then folds tp again.
  bool tp_held = false;
  // dp groups span several nodes with several members on each: a full dp
  // fold may meet members whose collectives end apart (their first sends
  // go over other links), so weaker() then folds dp by place: each member
  // is played by the member at its local place on its group's first node.
  bool spans_nodes = false;
  bool by_place = false;
  std::vector<int> representative;  // (world) empty: nothing folded
  int running() const;              // ranks with a thread
  std::string describe() const;     // "dp 24 and tp 8 folded: 8 of 1536 devices run"
};

// What folding reads of a run: its mesh and the two facts that make ranks
// of a dimension differ.
struct FoldInput {
  collectives::MeshShape mesh;
  // ZeRO: some dp rank owns a chunk of another size than its peers (a
  // bucket that its group does not divide: preflight.h's uneven_chunks).
  bool uneven_chunks = false;
  bool moe = false;                // an MoE model: tp peers route and hold experts apart
  // An MoE model's data ranks (and the ep ranks among them) provably route
  // alike: a phantom run whose routing is a function of the shapes alone
  // (no capacity counted over the data ranks, whose drops follow the global
  // token order) and, with expert parallelism, uniform routing that gives
  // every expert the same rows (ParallelPlan's routes_alike). Without it
  // only a dense model's dp ranks (ep 1) fold.
  bool routes_alike = false;
  // --cp-comm allgather: each cp rank takes the gathered blocks in rank
  // order, so it meets its diagonal chunk pairs at another place than its
  // peers (the same kernels in another order): its cp ranks are not folded.
  bool cp_gathers = false;
};

// The plan for `input` on `profile` (nodes from the profile).
FoldPlan fold_plan(const FoldInput& input, const HardwareProfile& profile);

// The next plan to try when `plan` met an asymmetric collective or ring
// (FoldingError): dp by place (when its groups span nodes); with cp folded,
// without tp, then without cp (tp folded again); then without tp (dp
// alone), then without dp (tp alone), then without any.
FoldPlan weaker(const FoldPlan& plan, const collectives::MeshShape& mesh, const HardwareProfile& profile);

}  // namespace shardlab::engine
