// Abstract execution of a pipeline Schedule (declared in pipeline/schedule.h): every
// rank runs its list in order, sends never block, receives block on a FIFO
// channel per (from, to, activation|grad). Compute advances the rank's clock
// by its cost; a receive moves it to the send's time (communication is free).
// The times depend only on the dependencies, not on the order in which the
// simulator visits ranks, so one sweep loop serves validation and timing.
#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "model/parallel/pipeline/schedule.h"
#include "runtime/errors.h"

namespace shardlab::parallel {
namespace {

using K = ActionKind;

struct Message {
  int micro_batch;
  int chunk;  // the receiver's chunk
  double time;
};

// What a receive buffer (of one chunk, one id) holds: a micro-batch whose
// forward or backward has not consumed it yet, or nothing.
constexpr int kEmpty = -1;

struct RankState {
  size_t pc = 0;
  double clock = 0;
  // [chunk][micro_batch]
  std::vector<std::vector<char>> forward_done, input_done, weight_done, grad_sent;
  // [chunk][buffer id] -> micro-batch held (kEmpty when consumed or unused)
  std::vector<std::vector<int>> act_buf, grad_buf;
  RankTiming timing;
};

class Simulator {
 public:
  Simulator(const Schedule& schedule, int micro_batches, int vpp, const StepCosts& costs, StageOrder order)
      : schedule_(schedule),
        pp_(static_cast<int>(schedule.size())),
        m_(micro_batches),
        vpp_(vpp),
        order_(order),
        costs_(costs),
        ranks_(schedule.size()) {
    const std::vector<std::vector<char>> none(static_cast<size_t>(vpp),
                                              std::vector<char>(static_cast<size_t>(m_), 0));
    for (RankState& r : ranks_) {
      r.forward_done = r.input_done = r.weight_done = r.grad_sent = none;
      r.act_buf = r.grad_buf = std::vector<std::vector<int>>(static_cast<size_t>(vpp));
      r.timing.start = -1;
    }
  }

  // "" when every list ran to the end with nothing left over, else the fault.
  std::string run() {
    for (;;) {
      bool progress = false, done = true;
      for (int rank = 0; rank < pp_; ++rank) {
        const auto& actions = schedule_[static_cast<size_t>(rank)];
        RankState& r = ranks_[static_cast<size_t>(rank)];
        while (r.pc < actions.size()) {
          std::string error;
          const bool ran = step(rank, actions[r.pc], &error);
          if (!error.empty()) return where(rank, r.pc) + ": " + error;
          if (!ran) break;
          ++r.pc;
          progress = true;
        }
        done = done && r.pc == actions.size();
      }
      if (done) return leftovers();
      if (!progress) return deadlock();
    }
  }

  ScheduleTiming timing() const {
    ScheduleTiming t;
    for (const RankState& r : ranks_) {
      t.ranks.push_back(r.timing);
      t.makespan = std::max(t.makespan, r.timing.end);
    }
    for (const RankTiming& r : t.ranks) {
      if (t.makespan > 0) t.bubble_fraction += (t.makespan - r.busy) / t.makespan / pp_;
    }
    return t;
  }

 private:
  int stage(int rank, int chunk) const { return stage_of(order_, pp_, rank, chunk); }
  int rank_of(int s) const { return rank_of_stage(order_, pp_, s); }
  int last_stage() const { return pp_ * vpp_ - 1; }

  std::string where(int rank, size_t pc) const {
    const Action& a = schedule_[static_cast<size_t>(rank)][pc];
    return "rank " + std::to_string(rank) + " action " + std::to_string(pc) + " (" +
           action_label(a, vpp_ > 1) + ")";
  }

  // Runs one action; false when a receive must wait. Sets *error on a fault.
  bool step(int rank, const Action& a, std::string* error) {
    if (a.micro_batch < 0 || a.micro_batch >= m_ || a.chunk < 0 || a.chunk >= vpp_ ||
        a.buffer_id() < 0) {
      *error = "micro-batch, chunk or buffer out of range";
      return false;
    }
    RankState& r = ranks_[static_cast<size_t>(rank)];
    const auto mb = static_cast<size_t>(a.micro_batch), c = static_cast<size_t>(a.chunk);
    const int s = stage(rank, a.chunk);
    switch (a.kind) {
      case K::kForward:
        *error = forward(r, a, s);
        return error->empty();
      case K::kBackward:
      case K::kBackwardInput:
        *error = backward_input(r, a, s);
        return error->empty();
      case K::kBackwardWeight:
        *error = backward_weight(r, a);
        return error->empty();
      case K::kSendActivation:
        return send(rank, a, s + 1, r.forward_done[c][mb] && !r.input_done[c][mb],
                    r.forward_done[c][mb] ? "after its backward freed it" : "before its forward",
                    error);
      case K::kSendGrad:
        return send_grad(rank, a, s, error);
      case K::kRecvActivation:
        return receive(rank, a, s - 1, held(r.act_buf, a), "activation", error);
      case K::kRecvGrad:
        return receive(rank, a, s + 1, held(r.grad_buf, a), "gradient", error);
    }
    return false;
  }

  bool send_grad(int rank, const Action& a, int s, std::string* error) {
    RankState& r = ranks_[static_cast<size_t>(rank)];
    char& sent = r.grad_sent[static_cast<size_t>(a.chunk)][static_cast<size_t>(a.micro_batch)];
    const bool ready = r.input_done[static_cast<size_t>(a.chunk)][static_cast<size_t>(a.micro_batch)];
    if (sent) {
      *error = "sends the input gradient twice";
      return false;
    }
    sent = ready;
    return send(rank, a, s - 1, ready, "before its backward", error);
  }

  // The receive buffer an action names, grown on first use.
  static int& held(std::vector<std::vector<int>>& buffers, const Action& a) {
    auto& ids = buffers[static_cast<size_t>(a.chunk)];
    const auto id = static_cast<size_t>(a.buffer_id());
    if (ids.size() <= id) ids.resize(id + 1, kEmpty);
    return ids[id];
  }

  // "" when buffer `b` holds the action's micro-batch (now consumed), else the fault.
  static std::string consume(int& b, const Action& a, const char* what) {
    if (b == a.micro_batch) {
      b = kEmpty;
      return "";
    }
    if (b == kEmpty) return "";  // reported by the caller as "before ... arrived"
    return std::string("reads ") + what + " buffer " + std::to_string(a.buffer_id()) +
           ", which holds micro-batch " + std::to_string(b);
  }

  std::string forward(RankState& r, const Action& a, int s) {
    const auto mb = static_cast<size_t>(a.micro_batch), c = static_cast<size_t>(a.chunk);
    if (r.forward_done[c][mb]) return "repeated forward";
    if (s > 0) {
      int& b = held(r.act_buf, a);
      if (b == kEmpty) return "forward before its input arrived";
      const std::string e = consume(b, a, "activation");
      if (!e.empty()) return "forward " + e;
    }
    compute(r, costs_.forward, &r.forward_done[c][mb]);
    return "";
  }

  std::string backward_input(RankState& r, const Action& a, int s) {
    const auto mb = static_cast<size_t>(a.micro_batch), c = static_cast<size_t>(a.chunk);
    if (r.input_done[c][mb]) return "repeated backward";
    if (!r.forward_done[c][mb]) return "backward before its forward";
    if (s < last_stage()) {
      int& b = held(r.grad_buf, a);
      if (b == kEmpty) return "backward before the next stage's gradient arrived";
      const std::string e = consume(b, a, "gradient");
      if (!e.empty()) return "backward " + e;
    }
    const bool fused = a.kind == K::kBackward;
    compute(r, fused ? costs_.backward : costs_.backward - costs_.weight, &r.input_done[c][mb]);
    if (fused) r.weight_done[c][mb] = 1;
    return "";
  }

  std::string backward_weight(RankState& r, const Action& a) {
    const auto mb = static_cast<size_t>(a.micro_batch), c = static_cast<size_t>(a.chunk);
    if (r.weight_done[c][mb]) return "repeated weight gradient";
    if (!r.input_done[c][mb]) return "weight gradient before its input gradient";
    compute(r, costs_.weight, &r.weight_done[c][mb]);
    return "";
  }

  void compute(RankState& r, double cost, char* done) {
    if (r.timing.start < 0) r.timing.start = r.clock;
    r.timing.action_start.push_back(r.clock);
    r.clock += cost;
    r.timing.action_end.push_back(r.clock);
    r.timing.end = r.clock;
    r.timing.busy += cost;
    *done = 1;
  }

  // `to` is the stage the tensor goes to; `ready` whether it exists now (else `why`).
  bool send(int rank, const Action& a, int to, bool ready, const char* why, std::string* error) {
    if (to < 0 || to > last_stage()) {
      *error = "send past the end of the pipeline";
    } else if (a.peer != rank_of(to)) {
      *error = "peer should be rank " + std::to_string(rank_of(to));
    } else if (!ready) {
      *error = std::string("send ") + why;
    } else {
      RankState& r = ranks_[static_cast<size_t>(rank)];
      channel(rank, a.peer, a.kind == K::kSendGrad).push_back({a.micro_batch, to / pp_, r.clock});  // chunk of stage `to`
      r.timing.action_start.push_back(r.clock);
      r.timing.action_end.push_back(r.clock);
    }
    return error->empty();
  }

  // `from` is the stage the tensor comes from; fills `buffer` once received.
  bool receive(int rank, const Action& a, int from, int& buffer, const char* what,
               std::string* error) {
    if (from < 0 || from > last_stage()) {
      *error = "receive from beyond the end of the pipeline";
      return false;
    }
    if (a.peer != rank_of(from)) {
      *error = "peer should be rank " + std::to_string(rank_of(from));
      return false;
    }
    auto& queue = channel(a.peer, rank, a.kind == K::kRecvGrad);
    if (queue.empty()) return false;
    const Message msg = queue.front();
    if (msg.micro_batch != a.micro_batch || msg.chunk != a.chunk) {
      *error = "next message on the channel is micro-batch " + std::to_string(msg.micro_batch) +
               " chunk " + std::to_string(msg.chunk);
      return false;
    }
    if (buffer != kEmpty) {
      *error = std::string("overwrites ") + what + " buffer " + std::to_string(a.buffer_id()) +
               " while it still holds micro-batch " + std::to_string(buffer) +
               " (not yet consumed)";
      return false;
    }
    queue.pop_front();
    RankState& r = ranks_[static_cast<size_t>(rank)];
    r.timing.action_start.push_back(r.clock);
    r.clock = std::max(r.clock, msg.time);
    r.timing.action_end.push_back(r.clock);
    buffer = a.micro_batch;
    return true;
  }

  std::deque<Message>& channel(int from, int to, bool grad) { return channels_[{from, to, grad}]; }

  std::string deadlock() const {
    std::string text = "deadlock:";
    for (int rank = 0; rank < pp_; ++rank) {
      const RankState& r = ranks_[static_cast<size_t>(rank)];
      if (r.pc == schedule_[static_cast<size_t>(rank)].size()) continue;
      text += ' ';
      text += where(rank, r.pc);
    }
    return text + " blocked";
  }

  std::string leftovers() const {
    for (const auto& [key, queue] : channels_) {
      if (queue.empty()) continue;
      const auto [from, to, grad] = key;
      return "rank " + std::to_string(from) + " sends " + (grad ? "a gradient" : "an activation") +
             " of micro-batch " + std::to_string(queue.front().micro_batch) + " that rank " +
             std::to_string(to) + " never receives";
    }
    for (int rank = 0; rank < pp_; ++rank) {
      const RankState& r = ranks_[static_cast<size_t>(rank)];
      for (int c = 0; c < vpp_; ++c) {
        for (int mb = 0; mb < m_; ++mb) {
          const auto uc = static_cast<size_t>(c), um = static_cast<size_t>(mb);
          if (r.forward_done[uc][um] && r.input_done[uc][um] && r.weight_done[uc][um]) continue;
          const char* what = !r.forward_done[uc][um] ? "forward"
                             : !r.input_done[uc][um] ? "backward"
                                                     : "weight gradient";
          return "rank " + std::to_string(rank) + " never runs the " + what + " of micro-batch " +
                 std::to_string(mb) + " chunk " + std::to_string(c);
        }
      }
    }
    return "";
  }

  const Schedule& schedule_;
  int pp_, m_, vpp_;
  StageOrder order_;
  StepCosts costs_;
  std::vector<RankState> ranks_;
  std::map<std::tuple<int, int, bool>, std::deque<Message>> channels_;
};

}  // namespace

std::string validate_schedule(const Schedule& schedule, int micro_batches, int vpp, StageOrder order) {
  if (schedule.empty()) return "no pipeline ranks";
  Simulator sim(schedule, micro_batches, vpp, StepCosts{}, order);
  return sim.run();
}

ScheduleTiming simulate_schedule(const Schedule& schedule, const StepCosts& costs, StageOrder order) {
  int micro_batches = 1, vpp = 1;
  for (const auto& actions : schedule) {
    for (const Action& a : actions) {
      micro_batches = std::max(micro_batches, a.micro_batch + 1);
      vpp = std::max(vpp, a.chunk + 1);
    }
  }
  Simulator sim(schedule, micro_batches, vpp, costs, order);
  const std::string error = sim.run();
  SHARDLAB_CHECK(error.empty(), "simulate_schedule on an invalid schedule: " + error);
  return sim.timing();
}

}  // namespace shardlab::parallel
