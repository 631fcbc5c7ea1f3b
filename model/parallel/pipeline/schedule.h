// Pipeline schedules as data (Megatron schedules.py, STYLE habit 7): a small
// function per schedule builds, for every pipeline rank, the ordered list of
// actions that rank's executor performs. No model math lives here.
//
// Sizes: pp pipeline ranks, M micro-batches, v (vpp) model chunks per rank,
// S = v·pp virtual stages; stage s feeds s + 1. Which stage a rank's chunk is
// follows the StageOrder: Megatron's loop (s = chunk·pp + rank, so without
// interleaving the stage is the rank) or the V of ZB-V and DualPipeV (chunk 1
// runs back up the ranks: rank 0 holds the first and the last stage).
//
// Placement: a receive sits right before the compute that consumes it, a send
// right after the compute that produces it. Sends never block (buffered),
// receives block until the matching message arrives; each (from, to, kind)
// channel is FIFO. Under these rules every list built here runs without
// deadlock (validate_schedule checks it by simulation). With pp = 1 and
// interleaving, chunk c hands its output to chunk c + 1 on the same rank: the
// send and receive then name the rank itself as the peer.
//
// Backward is one action (kBackward: the input gradient B, then the weight
// gradient W, fused) or two (kBackwardInput, later kBackwardWeight), as the
// zero-bubble schedules need: B is what the previous stage waits for, W can
// fill a bubble.
//
// Buffers. Each rank receives activations and gradients into buffers owned
// per (chunk, buffer id); a receive names the buffer it fills and the forward
// or backward that consumes it names the same one (Action::buffer, by default
// the micro-batch: one buffer per (chunk, micro-batch)). A schedule may reuse
// ids to bound its receive memory; validate_schedule then checks that no
// receive overwrites a buffer whose data has not been consumed yet, so a
// schedule either runs correctly or is rejected.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardlab::parallel {

enum class ActionKind {
  kForward,
  kBackward,  // B then W
  kSendActivation,
  kRecvActivation,
  kSendGrad,
  kRecvGrad,
  kBackwardInput,   // B: the input gradient only; its W comes later
  kBackwardWeight,  // W: the weight gradient of an earlier kBackwardInput
};

// One step of one rank. For sends and receives, micro_batch and chunk name
// the local computation the tensor comes from (send) or is for (receive).
struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;
  int chunk = 0;  // model chunk on this rank, 0..v-1 (0 without interleaving)
  int peer = -1;  // the other rank of a send/receive; -1 for compute
  // Receives and the forward / backward that consume them: the receive
  // buffer (of this chunk); -1 = the micro-batch's own.
  int buffer = -1;
  // combined_1f1b: this forward and the backward right after it are one step
  // (a steady pair; the executor runs the two as two programs, executor.h).
  bool paired = false;

  int buffer_id() const { return buffer < 0 ? micro_batch : buffer; }
  bool is_compute() const {
    return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
           kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
  }
  // Computes an input gradient (and reads the received output gradient).
  bool is_backward_input() const {
    return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput;
  }
  bool operator==(const Action&) const = default;
};

// schedule[rank] = that rank's actions, in execution order.
using Schedule = std::vector<std::vector<Action>>;

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kZbH1, kZbH2, kZbV, kDualPipeV };

// "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "zb-h2" | "zb-v" | "dualpipev";
// anything else throws ConfigError.
ScheduleKind parse_schedule(std::string_view name);
std::string_view schedule_name(ScheduleKind kind);

// Where virtual stage s lives. kLoop: rank s % pp, chunk s / pp (Megatron).
// kV: chunk c runs down the ranks when c is even and back up when c is odd,
// so stage pp - 1 hands to stage pp on the same rank (the V's tip) and the
// first and last stages share rank 0 (ZB-V, DualPipeV).
enum class StageOrder { kLoop, kV };
int stage_of(StageOrder order, int pp, int rank, int chunk);
int rank_of_stage(StageOrder order, int pp, int stage);
// kV for zb-v and dualpipev, kLoop otherwise.
StageOrder stage_order(ScheduleKind kind);
// Model chunks per rank a schedule needs: 2 for the V schedules, 0 when the
// user chooses (--vpp, interleaved), 1 otherwise.
int schedule_chunks(ScheduleKind kind);
// The zero-bubble schedules: backward split into B and W actions.
bool splits_backward(ScheduleKind kind);

// Throws ConfigError naming the option field (`pp`): pp >= 1,
// micro_batches >= 1; for interleaved vpp >= 2 and micro_batches a multiple
// of pp; for zb-v and dualpipev vpp 2 (their V) and micro_batches >= 2·pp;
// otherwise vpp must be 1.
void check_pipeline_config(ScheduleKind kind, int pp, int micro_batches, int vpp);

// All forwards (0..M-1), then all backwards (0..M-1). Stashes M micro-batches.
Schedule gpipe(int pp, int micro_batches);
// Megatron forward_backward_pipelining_without_interleaving: warm-up of
// min(pp - rank - 1, M) forwards, steady one forward + one backward,
// cool-down of the remaining backwards. Stashes min(pp - rank, M).
Schedule one_f_one_b(int pp, int micro_batches);
// Megatron forward_backward_pipelining_with_interleaving: micro-batches run
// in groups of pp through chunk 0, 1, ..., v-1 (backwards from chunk v-1);
// warm-up of 2·(pp - rank - 1) + (v - 1)·pp chunk-forwards (all v·M when
// M == pp). Needs M % pp == 0 and v >= 2.
Schedule interleaved_1f1b(int pp, int micro_batches, int vpp);
// Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm,
// schedules.py get_pp_rank_microbatches and combined_1f1b.py): the
// interleaved lists with one more warm-up forward, so that each steady
// forward and backward are of different micro-batches, and each such pair
// as both receives, the forward, the backward, both sends (the executor
// runs the two as one step). pp 1 with vpp 1 is Megatron's no-pipelining
// combined schedule: F0, F(i) with B(i-1), B(M-1). Otherwise the
// interleaved schedule's rules (Megatron needs virtual stages with pp > 1).
Schedule combined_1f1b(int pp, int micro_batches, int vpp);
// Compute costs in abstract time units; communication costs nothing.
struct StepCosts {
  double forward = 1.0;
  double backward = 2.0;  // B + W (kBackward)
  double weight = 1.0;    // the W part of backward: kBackwardInput costs backward - weight
};

// The zero-bubble family (Qi et al., "Zero Bubble Pipeline Parallelism",
// ICLR 2024; DeepSeek-V3's DualPipe), built in schedule_zb.cc. Every backward
// is a B and a W; T_F, T_B, T_W are the times of F, B and W of one chunk.
//
// ZB-H1 (the paper's handcrafted memory-efficient schedule): 1F1B's warm-up,
// then rank r runs r backwards without their W and keeps r weight gradients
// pending, one W after every later B, the r pending ones last. Peak memory
// that of 1F1B (pp - r micro-batches before B, r W stashes); bubble
// (p-1)(T_F + T_B - T_W), a third of 1F1B's (p-1)(T_F + T_B + T_W) when the
// three are equal.
Schedule zb_h1(int pp, int micro_batches);
// ZB-H2: up to 2p - 1 micro-batches in flight, so the warm-up forwards fill
// the time before the first gradient arrives and the pending W fill the tail:
// each rank's busy span is gap-free (the paper's parallelogram) when T_F =
// T_B = T_W. Built by a greedy list scheduler (schedule_zb.cc): each idle
// rank runs a ready B, else a ready F while memory allows, else a pending W,
// timed with `costs` (default: unit times, as the paper draws it).
Schedule zb_h2(int pp, int micro_batches, const StepCosts& costs = {});
// ZB-V: two chunks per rank in a V (StageOrder::kV) with 1F1B's memory (2p
// half-stage activations until their W on every rank) and, at T_F = T_B =
// T_W, only the fill as bubble: built here as DualPipeV's phases with each
// steady pair's backward run before its forward (which is what keeps one
// activation fewer in flight). Needs M >= 2p.
Schedule zb_v(int pp, int micro_batches);
// DualPipeV (DeepSeek's DualPipe cut in half, one V per rank): the eight
// phases of DeepSeek's reference schedule (F0 warm-up, F0F1, B1W1F1, the
// F0B1F1B0 steady pairs, B1F1B0, B1B0, WB0, W). Needs M >= 2p. The pairs
// DualPipe overlaps (one chunk's forward with another's backward, to hide
// expert all-to-all) run back to back on the compute stream here.
Schedule dualpipe_v(int pp, int micro_batches);

// Checks the configuration, then dispatches (vpp must be the schedule's
// chunk count, see check_pipeline_config).
Schedule build_schedule(ScheduleKind kind, int pp, int micro_batches, int vpp = 1);
// The same schedule with every fused backward split into B and W, each W
// right after its B (`defer_weights` false) or all W at the end of each
// rank's list in the order of their B (true).
Schedule split_backward(const Schedule& schedule, bool defer_weights);

// Runs the lists abstractly with blocking receives and non-blocking sends.
// Returns "" when valid, else one line naming the rank, the action and the
// fault: a send or receive to the wrong peer or out of FIFO order, a forward
// before its input arrived, a backward before its forward or before the next
// stage's gradient, a missing or repeated forward/backward of a (micro-batch,
// chunk), a W without its B or a B without its W, a receive into a buffer
// whose data is not consumed yet, a compute reading a buffer that does not
// hold its micro-batch, sending an activation after its backward freed it or
// an input gradient twice or before it exists, a send nobody receives, or a
// deadlock (with every blocked rank).
std::string validate_schedule(const Schedule& schedule, int micro_batches, int vpp = 1,
                              StageOrder order = StageOrder::kLoop);


struct RankTiming {
  double start = 0;                  // first compute starts
  double end = 0;                    // last compute ends
  double busy = 0;                   // sum of compute durations
  std::vector<double> action_start;  // per action of the rank's list
  std::vector<double> action_end;
};

struct ScheduleTiming {
  std::vector<RankTiming> ranks;
  double makespan = 0;  // latest end over ranks; every rank starts its clock at 0
  // Mean over ranks of (makespan - busy) / makespan: the idle share of each
  // compute stream. Uniform costs give (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1).
  double bubble_fraction = 0;
};

// The schedule must be valid (CHECK-fails on a deadlock).
ScheduleTiming simulate_schedule(const Schedule& schedule, const StepCosts& costs = {},
                                 StageOrder order = StageOrder::kLoop);

// Peak number of (micro-batch, chunk) activations each rank holds: forwards
// done whose backward is not yet done. gpipe M; 1f1b min(pp - rank, M).
// With `until_weight`, an activation counts until its W (the W stash): the
// zero-bubble schedules' memory.
std::vector<int> peak_in_flight(const Schedule& schedule, bool until_weight = false);

// "F3", "B0", "W0", "F1b" (chunk as a letter when chunked), "sA2>1", "rG0<2"...
// A backward split into B and W shows as "B" and "W".
std::string action_label(const Action& action, bool chunked);
// One row per rank of compute only: "rank 0: F0 F1 F2 B0 F3 B1 ...".
std::string format_schedule(const Schedule& schedule);
// One row per rank aligned on time (costs in whole units), "." for idle:
// "rank 1: .  F0 F1 B0 B0 ...". Each unit is one cell.
std::string format_timeline(const Schedule& schedule, const StepCosts& costs = {},
                            StageOrder order = StageOrder::kLoop);

}  // namespace shardlab::parallel
