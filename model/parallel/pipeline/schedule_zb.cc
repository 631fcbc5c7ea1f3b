// The zero-bubble schedules (schedule.h): ZB-H1 and DualPipeV written out
// phase by phase as their authors describe them, ZB-V as DualPipeV's phases
// with each steady pair's backward first, ZB-H2 built by a greedy list
// scheduler.
#include <algorithm>
#include <deque>
#include <utility>

#include "model/parallel/pipeline/schedule.h"
#include "model/parallel/pipeline/schedule_build.h"
#include "runtime/errors.h"

namespace shardlab::parallel {
namespace {

using K = ActionKind;

// One rank's list under construction: forwards and backwards per chunk in
// micro-batch order, and the B whose W is still to come, oldest first.
class RankBuilder {
 public:
  RankBuilder(std::vector<Action>& out, StageOrder order, int pp, int vpp, int rank)
      : out_(out), order_(order), pp_(pp), vpp_(vpp), rank_(rank), next_f_(size_t(vpp)), next_b_(size_t(vpp)) {}

  int forwards(int chunk) const { return next_f_[size_t(chunk)]; }
  int backwards(int chunk) const { return next_b_[size_t(chunk)]; }
  bool weights_pending() const { return !pending_.empty(); }

  void forward(int chunk) { add_forward(out_, order_, pp_, vpp_, rank_, next_f_[size_t(chunk)]++, chunk); }
  // The B of the chunk's next backward; its W waits (`defer`) or follows at once.
  void backward(int chunk, bool defer) {
    const int mb = next_b_[size_t(chunk)]++;
    add_backward(out_, order_, pp_, vpp_, rank_, mb, chunk, defer ? K::kBackwardInput : K::kBackward);
    if (defer) pending_.emplace_back(mb, chunk);
  }
  // The oldest pending W.
  void weight() {
    SHARDLAB_CHECK(!pending_.empty(), "schedule builder: a W with no pending B");
    out_.push_back({K::kBackwardWeight, pending_.front().first, pending_.front().second, -1});
    pending_.pop_front();
  }
  // A B followed by the oldest pending W: its own W (fused) when none was pending.
  void backward_then_weight(int chunk) {
    const bool own = pending_.empty();
    backward(chunk, !own);
    if (!own) weight();
  }
  void drain_weights() {
    while (!pending_.empty()) weight();
  }

 private:
  std::vector<Action>& out_;
  StageOrder order_;
  int pp_, vpp_, rank_;
  std::vector<int> next_f_, next_b_;
  std::deque<std::pair<int, int>> pending_;  // (micro-batch, chunk)
};

// Greedy list scheduling with one chunk per rank (stage = rank), the
// construction of the paper's handcrafted schedules (drawn for T_F = T_B =
// T_W): an event simulation in which, at every moment, each idle rank starts
// its next B if its gradient arrived, else its next F if its input arrived
// and fewer than `max_in_flight` activations wait for their W, else its
// oldest pending W, else waits for the next completion. Communication is
// free. (A greedy V, tried for ZB-V, is exact only at T_F = T_B = T_W: its
// order idles more with every micro-batch when they differ.)
class Greedy {
 public:
  Greedy(int pp, int m, int max_in_flight, const StepCosts& costs)
      : pp_(pp), m_(m), limit_(max_in_flight), costs_(costs),
        schedule_(static_cast<size_t>(pp)),
        f_end_(size_t(pp), std::vector<double>(size_t(m), kNever)), b_end_(f_end_),
        clock_(size_t(pp), 0.0), held_(size_t(pp), 0) {
    for (int r = 0; r < pp; ++r) ranks_.emplace_back(schedule_[size_t(r)], StageOrder::kLoop, pp, 1, r);
  }

  Schedule run() && {
    for (double t = 0;;) {
      for (int r = 0; r < pp_; ++r)
        if (clock_[size_t(r)] <= t) try_start(r, t);
      if (weights_ == pp_ * m_) return std::move(schedule_);
      double next = kNever;
      for (double c : clock_)
        if (c > t) next = std::min(next, c);
      SHARDLAB_CHECK(next < kNever, "greedy schedule made no progress");
      t = next;
    }
  }

 private:
  static constexpr double kNever = 1e300;

  void try_start(int r, double t) {
    RankBuilder& rb = ranks_[size_t(r)];
    const auto b = size_t(rb.backwards(0)), f = size_t(rb.forwards(0)), ur = size_t(r);
    const bool b_ready = int(b) < m_ && f_end_[ur][b] <= t && (r == pp_ - 1 || b_end_[ur + 1][b] <= t);
    const bool f_ready = int(f) < m_ && (r == 0 || f_end_[ur - 1][f] <= t) && held_[ur] < limit_;
    double& clock = clock_[ur];
    if (b_ready) {
      clock = b_end_[ur][b] = t + (costs_.backward - costs_.weight);
      rb.backward(0, /*defer=*/true);
    } else if (f_ready) {
      clock = f_end_[ur][f] = t + costs_.forward;
      rb.forward(0);
      ++held_[ur];
    } else if (rb.weights_pending()) {
      clock = t + costs_.weight;
      rb.weight();
      --held_[ur];
      ++weights_;
    }
  }

  int pp_, m_, limit_;
  StepCosts costs_;
  Schedule schedule_;
  std::vector<RankBuilder> ranks_;
  std::vector<std::vector<double>> f_end_, b_end_;  // [rank][micro-batch]: when its F / B ends
  std::vector<double> clock_;                       // when each rank is next free
  std::vector<int> held_;                           // activations waiting for their W
  int weights_ = 0;
};

}  // namespace

Schedule zb_h1(int pp, int micro_batches) {
  check_pipeline_config(ScheduleKind::kZbH1, pp, micro_batches, 1);
  const int m = micro_batches;
  Schedule schedule(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankBuilder rb(schedule[size_t(r)], StageOrder::kLoop, pp, 1, r);
    // 1F1B's warm-up.
    for (int i = 0; i < std::min(pp - r - 1, m); ++i) rb.forward(0);
    // r steady pairs whose W wait: B reaches the previous rank sooner.
    for (int i = 0; i < r && rb.forwards(0) < m; ++i) {
      rb.forward(0);
      rb.backward(0, /*defer=*/true);
    }
    // Steady F, B, W; then the cool-down's B, W; the r pending W fill the tail.
    while (rb.forwards(0) < m) {
      rb.forward(0);
      rb.backward_then_weight(0);
    }
    while (rb.backwards(0) < m) rb.backward_then_weight(0);
    rb.drain_weights();
  }
  return schedule;
}

Schedule zb_h2(int pp, int micro_batches, const StepCosts& costs) {
  check_pipeline_config(ScheduleKind::kZbH2, pp, micro_batches, 1);
  return Greedy(pp, micro_batches, 2 * pp - 1, costs).run();
}


namespace {

// DualPipeV's last two phases on rank r: backwards of both chunks, the second
// half of them with their W deferred (from the middle on; on odd ranks from
// chunk 1 of the middle pair, on even ranks from its chunk 0), then the
// pending W interleaved with the last chunk-0 backwards, then the rest.
void dualpipe_v_tail(RankBuilder& rb, int pp, int r) {
  const int pairs = r + 1;
  bool defer = false;
  for (int i = 0; i < pairs; ++i) {
    if (i == pairs / 2 && r % 2 == 1) defer = true;
    rb.backward(1, defer);
    if (i == pairs / 2 && r % 2 == 0) defer = true;
    rb.backward(0, defer);
  }
  for (int i = 0; i < pp - r - 1; ++i) {
    rb.weight();
    rb.backward(0, /*defer=*/true);
  }
  rb.drain_weights();
}

// The V schedules' phases on every rank r of p (chunk 0 runs down the ranks,
// chunk 1 back up): DeepSeek's DualPipeV, or ZB-V's memory when every
// steady pair runs its backward first.
Schedule v_phases(int pp, int m, bool backward_first) {
  Schedule schedule(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankBuilder rb(schedule[size_t(r)], StageOrder::kV, pp, 2, r);
    for (int i = 0; i < 2 * (pp - r - 1); ++i) rb.forward(0);  // 1: chunk-0 warm-up
    for (int i = 0; i < r + 1; ++i) rb.forward(0), rb.forward(1);  // 2: F0 F1
    for (int i = 0; i < pp - r - 1; ++i) {  // 3: B1 W1 F1
      rb.backward(1, /*defer=*/true);
      rb.weight();
      rb.forward(1);
    }
    for (int i = 0; i < m - 2 * pp + r + 1; ++i) {  // 4: the steady F0&B1, F1&B0 pairs
      if (backward_first) {
        rb.backward(1, false), rb.forward(0), rb.backward(0, false), rb.forward(1);
      } else {
        rb.forward(0), rb.backward(1, false), rb.forward(1), rb.backward(0, false);
      }
    }
    for (int i = 0; i < pp - r - 1; ++i) {  // 5: B1, F1&B0
      rb.backward(1, false);
      if (backward_first) {
        rb.backward(0, false), rb.forward(1);
      } else {
        rb.forward(1), rb.backward(0, false);
      }
    }
    dualpipe_v_tail(rb, pp, r);  // 6-8
  }
  return schedule;
}

}  // namespace

Schedule zb_v(int pp, int micro_batches) {
  check_pipeline_config(ScheduleKind::kZbV, pp, micro_batches, 2);
  return v_phases(pp, micro_batches, /*backward_first=*/true);
}

Schedule dualpipe_v(int pp, int micro_batches) {
  check_pipeline_config(ScheduleKind::kDualPipeV, pp, micro_batches, 2);
  return v_phases(pp, micro_batches, /*backward_first=*/false);
}

}  // namespace shardlab::parallel
