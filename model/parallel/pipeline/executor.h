// The pipeline executor: runs one rank's list of schedule actions
// (schedule.h) on its StageModel (stage_model.h) for one training step. Every
// training run goes through it: without pipeline parallelism the list is
// forward, backward per micro-batch (gradient accumulation).
//
// Activations and their gradients travel point to point between neighbouring
// pipeline ranks on the device's fabric, through a pipeline stream of their
// own (Megatron runs its p2p on separate streams): a send leaves when the
// compute stream has produced the tensor, a receive is posted when the
// compute stream reaches it, and the compute stream waits for the arrival,
// so the wait shows as idle compute time (the bubble) and the transfer sits
// on the "pipeline" track of the trace. The compute stream never waits for a
// send (Megatron's overlap_p2p_comm, as NeMo runs the interleaved schedule;
// Megatron itself waits for a send before the next compute of its
// direction, which a compute of the other direction usually covers), unless
// wait_for_sends (Megatron's batched, fully waited isend/irecv). Messages
// carry the real bytes; their virtual size is Nr·C elements at the modeled
// precision.
//
// Each action's `final` flag (the chunk's last backward action in the list)
// is computed once from the list: the model announces the chunk's gradients
// as final during it.
//
// Thread safety: one executor per device thread.
#pragma once

#include <deque>
#include <functional>
#include <vector>

#include "model/parallel/pipeline/schedule.h"
#include "model/parallel/pipeline/stage_model.h"
#include "runtime/device.h"

namespace shardlab::parallel {

// One forward, backward (B, or B and W fused) or weight gradient (W) of the
// last run, on the compute stream.
struct ComputeSpan {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0, chunk = 0;
  Time start = 0, end = 0;
};

// What one rank's forward-backward phase took, in virtual time.
struct PipelinePhase {
  Time start = 0;        // the compute stream when the phase began
  Time end = 0;          // ... and when its last action finished
  Time busy = 0;         // compute-stream busy time inside the phase
  uint64_t sent_bytes = 0;  // modeled bytes of activations and gradients sent
};

class PipelineExecutor {
 public:
  // `actions`: this rank's list; `pp_ranks[i]`: the global rank of pipeline
  // rank i (in the same tp/dp coordinates).
  PipelineExecutor(Device& dev, StageModel& model, std::vector<Action> actions,
                   std::vector<int> pp_ranks, int micro_batches);

  // Runs the list once. `tokens(mb)` gives the micro-batch's tokens; it is
  // called only on ranks holding the first or the last stage.
  PipelinePhase run(const std::function<MicroBatchTokens(int mb)>& tokens);
  // Called after every action with (actions done, actions in the list): a
  // long phantom step's progress. Empty: none.
  void on_action(std::function<void(size_t done, size_t total)> f) { on_action_ = std::move(f); }
  // Megatron without overlap_p2p_comm (ParallelOptions::overlap_p2p_comm
  // false): the compute stream waits after each send until its last byte has
  // left the egress port, as a batched isend/irecv whose requests are all
  // waited. Off (default): it never waits for a send.
  void wait_for_sends(bool on) { wait_sends_ = on; }
  // Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm; lists
  // from schedule.h combined_1f1b): a forward marked Action::paired and the
  // other micro-batch's backward right after it run as one step, the
  // forward first, the two interleaved at every MoE token exchange
  // (runtime/fiber.h Interleave; ShardedOptions::ep_comm_overlap makes the
  // exchanges yield). The list puts both receives before the pair and both
  // sends after it, as Megatron's pre_/post_forward and pre_/post_backward do.

  const std::vector<Action>& actions() const { return actions_; }
  // The forwards and backwards of the last run, in execution order.
  const std::vector<ComputeSpan>& spans() const { return spans_; }

 private:
  void send(const Action& a, const float* data);
  void recv(const Action& a, float* into);
  void execute(const Action& a, bool final, const std::function<MicroBatchTokens(int mb)>& tokens);

  Device& dev_;
  StageModel& model_;
  std::vector<Action> actions_;
  std::vector<char> final_;  // per action: the chunk's last backward action
  std::vector<int> pp_ranks_;
  int micro_batches_;
  Stream p2p_;
  bool wait_sends_ = false;
  uint64_t sent_bytes_ = 0;
  std::vector<ComputeSpan> spans_;
  // pp = 1 with interleaving: chunk c hands its tensors to chunk c ± 1 here.
  std::deque<std::vector<float>> local_[2];
  std::function<void(size_t, size_t)> on_action_;
};

}  // namespace shardlab::parallel
