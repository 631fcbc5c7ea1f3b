#include "model/parallel/pipeline/schedule.h"

#include <algorithm>
#include <cmath>

#include "model/parallel/pipeline/schedule_build.h"
#include "runtime/errors.h"

namespace shardlab::parallel {
namespace {

using K = ActionKind;

// "`pp` 4": an option field (in backquotes, as every library message names
// one) and its value.
std::string field_value(const char* field, int value) {
  return "`" + std::string(field) + "` " + std::to_string(value);
}

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                                   ScheduleKind::kZbH1,  ScheduleKind::kZbH2, ScheduleKind::kZbV,
                                   ScheduleKind::kDualPipeV};
constexpr const char* kScheduleNames[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev"};

}  // namespace

void add_forward(std::vector<Action>& out, StageOrder order, int pp, int vpp, int rank, int mb, int chunk) {
  const int s = stage_of(order, pp, rank, chunk);
  if (s > 0) out.push_back({K::kRecvActivation, mb, chunk, rank_of_stage(order, pp, s - 1)});
  out.push_back({K::kForward, mb, chunk, -1});
  if (s < pp * vpp - 1) out.push_back({K::kSendActivation, mb, chunk, rank_of_stage(order, pp, s + 1)});
}

void add_backward(std::vector<Action>& out, StageOrder order, int pp, int vpp, int rank, int mb, int chunk,
                  ActionKind kind) {
  const int s = stage_of(order, pp, rank, chunk);
  if (s < pp * vpp - 1) out.push_back({K::kRecvGrad, mb, chunk, rank_of_stage(order, pp, s + 1)});
  out.push_back({kind, mb, chunk, -1});
  if (s > 0) out.push_back({K::kSendGrad, mb, chunk, rank_of_stage(order, pp, s - 1)});
}

ScheduleKind parse_schedule(std::string_view name) {
  for (size_t i = 0; i < std::size(kKinds); ++i)
    if (name == kScheduleNames[i]) return kKinds[i];
  throw ConfigError("unknown `schedule` '" + std::string(name) +
                    "' (expected gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v or dualpipev)");
}

std::string_view schedule_name(ScheduleKind kind) { return kScheduleNames[static_cast<size_t>(kind)]; }

int stage_of(StageOrder order, int pp, int rank, int chunk) {
  const bool up = order == StageOrder::kV && chunk % 2 == 1;
  return chunk * pp + (up ? pp - 1 - rank : rank);
}

int rank_of_stage(StageOrder order, int pp, int stage) {
  const bool up = order == StageOrder::kV && (stage / pp) % 2 == 1;
  return up ? pp - 1 - stage % pp : stage % pp;
}

StageOrder stage_order(ScheduleKind kind) {
  return kind == ScheduleKind::kZbV || kind == ScheduleKind::kDualPipeV ? StageOrder::kV : StageOrder::kLoop;
}

int schedule_chunks(ScheduleKind kind) {
  if (kind == ScheduleKind::kInterleaved) return 0;
  return stage_order(kind) == StageOrder::kV ? 2 : 1;
}

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::kZbH1 || kind == ScheduleKind::kZbH2 || kind == ScheduleKind::kZbV ||
         kind == ScheduleKind::kDualPipeV;
}

void check_pipeline_config(ScheduleKind kind, int pp, int micro_batches, int vpp) {
  if (pp < 1) throw ConfigError(field_value("pp", pp) + ": must be at least 1");
  if (micro_batches < 1) {
    throw ConfigError(field_value("micro_batches", micro_batches) + ": must be at least 1");
  }
  const int chunks = schedule_chunks(kind);
  if (chunks == 2 && vpp != 2) {
    throw ConfigError(field_value("vpp", vpp) + ": `schedule` " + std::string(schedule_name(kind)) +
                      " places exactly 2 model chunks per rank (a V); use `vpp` 2");
  }
  if (chunks == 2 && micro_batches < 2 * pp) {
    throw ConfigError(field_value("micro_batches", micro_batches) + ": `schedule` " +
                      std::string(schedule_name(kind)) + " needs at least 2 x " + field_value("pp", pp));
  }
  if (chunks == 1 && vpp != 1) {
    throw ConfigError(field_value("vpp", vpp) + ": model chunks need `schedule` interleaved, zb-v or dualpipev");
  }
  if (kind != ScheduleKind::kInterleaved) return;
  if (vpp < 2) {
    throw ConfigError(field_value("vpp", vpp) +
                      ": `schedule` interleaved needs at least 2 model chunks per rank");
  }
  if (micro_batches % pp != 0) {
    throw ConfigError(field_value("micro_batches", micro_batches) + ": must be a multiple of " +
                      field_value("pp", pp) + " for `schedule` interleaved");
  }
}

Schedule gpipe(int pp, int micro_batches) {
  check_pipeline_config(ScheduleKind::kGPipe, pp, micro_batches, 1);
  Schedule schedule(static_cast<size_t>(pp));
  for (int rank = 0; rank < pp; ++rank) {
    auto& out = schedule[static_cast<size_t>(rank)];
    for (int mb = 0; mb < micro_batches; ++mb) add_forward(out, StageOrder::kLoop, pp, 1, rank, mb, 0);
    for (int mb = 0; mb < micro_batches; ++mb) add_backward(out, StageOrder::kLoop, pp, 1, rank, mb, 0);
  }
  return schedule;
}

Schedule one_f_one_b(int pp, int micro_batches) {
  check_pipeline_config(ScheduleKind::k1F1B, pp, micro_batches, 1);
  Schedule schedule(static_cast<size_t>(pp));
  for (int rank = 0; rank < pp; ++rank) {
    auto& out = schedule[static_cast<size_t>(rank)];
    const int warmup = std::min(pp - rank - 1, micro_batches);
    const int remaining = micro_batches - warmup;
    // Warm-up: forwards only, filling the pipeline below this rank.
    for (int i = 0; i < warmup; ++i) add_forward(out, StageOrder::kLoop, pp, 1, rank, i, 0);
    // Steady 1F1B: each forward followed by the oldest pending backward.
    for (int i = 0; i < remaining; ++i) {
      add_forward(out, StageOrder::kLoop, pp, 1, rank, warmup + i, 0);
      add_backward(out, StageOrder::kLoop, pp, 1, rank, i, 0);
    }
    // Cool-down: the backwards of the warm-up forwards.
    for (int i = remaining; i < micro_batches; ++i) add_backward(out, StageOrder::kLoop, pp, 1, rank, i, 0);
  }
  return schedule;
}

namespace {

// Megatron's interleaved lists (vpp 1 and pp 1 allowed: the no-pipeline
// combined schedule). `combined`: one more warm-up forward, and each steady
// forward and backward as one pair (both receives, F, B, both sends).
Schedule interleaved_lists(int pp, int micro_batches, int vpp, bool combined) {
  const int total = micro_batches * vpp;  // chunk-forwards per rank
  const int group = pp * vpp;
  // Megatron get_model_chunk_id / get_microbatch_id_in_model_chunk: the k-th
  // chunk-step runs micro-batch (k / group)·pp + k % pp through chunk
  // (k % group) / pp, counted from the last chunk for backwards.
  auto micro_batch = [&](int k) { return (k / group) * pp + k % pp; };
  auto chunk = [&](int k, bool forward) {
    const int c = (k % group) / pp;
    return forward ? c : vpp - 1 - c;
  };
  Schedule schedule(static_cast<size_t>(pp));
  for (int rank = 0; rank < pp; ++rank) {
    auto& out = schedule[static_cast<size_t>(rank)];
    const int warmup = micro_batches == pp
                           ? total
                           : std::min(2 * (pp - rank - 1) + (vpp - 1) * pp + (combined ? 1 : 0), total);
    const int remaining = total - warmup;
    auto forward = [&](int k) { add_forward(out, StageOrder::kLoop, pp, vpp, rank, micro_batch(k), chunk(k, true)); };
    auto backward = [&](int k) {
      add_backward(out, StageOrder::kLoop, pp, vpp, rank, micro_batch(k), chunk(k, false));
    };
    // Warm-up.
    for (int k = 0; k < warmup; ++k) forward(k);
    // Steady 1F1B.
    for (int k = 0; k < remaining; ++k) {
      if (!combined) {
        forward(warmup + k);
        backward(k);
        continue;
      }
      // The pair: receives first, sends last (Megatron's pre_forward,
      // pre_backward, the combined chunks, post_forward, post_backward).
      // add_forward and add_backward emit [receive] compute [send]: regroup
      // the pair's actions by that phase.
      std::vector<Action> pair;
      add_forward(pair, StageOrder::kLoop, pp, vpp, rank, micro_batch(warmup + k), chunk(warmup + k, true));
      add_backward(pair, StageOrder::kLoop, pp, vpp, rank, micro_batch(k), chunk(k, false));
      const auto phase = [](const Action& a) {
        return a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kRecvGrad ? 0 : a.is_compute() ? 1 : 2;
      };
      std::stable_sort(pair.begin(), pair.end(), [&](const Action& x, const Action& y) { return phase(x) < phase(y); });
      for (Action& a : pair) a.paired = a.kind == ActionKind::kForward;
      out.insert(out.end(), pair.begin(), pair.end());
    }
    // Cool-down.
    for (int k = remaining; k < total; ++k) backward(k);
  }
  return schedule;
}

}  // namespace

Schedule interleaved_1f1b(int pp, int micro_batches, int vpp) {
  check_pipeline_config(ScheduleKind::kInterleaved, pp, micro_batches, vpp);
  return interleaved_lists(pp, micro_batches, vpp, false);
}

Schedule combined_1f1b(int pp, int micro_batches, int vpp) {
  if (pp > 1 || vpp > 1) check_pipeline_config(ScheduleKind::kInterleaved, pp, micro_batches, vpp);
  else check_pipeline_config(ScheduleKind::k1F1B, pp, micro_batches, vpp);
  return interleaved_lists(pp, micro_batches, vpp, true);
}

Schedule build_schedule(ScheduleKind kind, int pp, int micro_batches, int vpp) {
  check_pipeline_config(kind, pp, micro_batches, vpp);
  switch (kind) {
    case ScheduleKind::kGPipe:
      return gpipe(pp, micro_batches);
    case ScheduleKind::k1F1B:
      return one_f_one_b(pp, micro_batches);
    case ScheduleKind::kInterleaved:
      return interleaved_1f1b(pp, micro_batches, vpp);
    case ScheduleKind::kZbH1:
      return zb_h1(pp, micro_batches);
    case ScheduleKind::kZbH2:
      return zb_h2(pp, micro_batches);
    case ScheduleKind::kZbV:
      return zb_v(pp, micro_batches);
    case ScheduleKind::kDualPipeV:
      return dualpipe_v(pp, micro_batches);
  }
  SHARDLAB_CHECK(false, "unknown schedule kind");
}

Schedule split_backward(const Schedule& schedule, bool defer_weights) {
  Schedule out(schedule.size());
  for (size_t rank = 0; rank < schedule.size(); ++rank) {
    const std::vector<Action>& in = schedule[rank];
    std::vector<Action> weights;
    for (size_t i = 0; i < in.size(); ++i) {
      Action a = in[i];
      if (a.kind != K::kBackward) {
        out[rank].push_back(a);
        continue;
      }
      a.kind = K::kBackwardInput;
      out[rank].push_back(a);
      // The previous stage waits for the input gradient: send it before W.
      if (i + 1 < in.size() && in[i + 1].kind == K::kSendGrad) out[rank].push_back(in[++i]);
      const Action w{K::kBackwardWeight, a.micro_batch, a.chunk, -1};
      (defer_weights ? weights : out[rank]).push_back(w);
    }
    out[rank].insert(out[rank].end(), weights.begin(), weights.end());
  }
  return out;
}

std::vector<int> peak_in_flight(const Schedule& schedule, bool until_weight) {
  std::vector<int> peaks;
  for (const auto& actions : schedule) {
    int live = 0, peak = 0;
    for (const Action& a : actions) {
      if (a.kind == K::kForward) peak = std::max(peak, ++live);
      const bool freed = until_weight ? a.kind == K::kBackward || a.kind == K::kBackwardWeight : a.is_backward_input();
      if (freed) --live;
    }
    peaks.push_back(peak);
  }
  return peaks;
}

std::string action_label(const Action& a, bool chunked) {
  static constexpr const char* kNames[] = {"F", "B", "sA", "rA", "sG", "rG", "B", "W"};
  std::string label = kNames[static_cast<int>(a.kind)];
  label += std::to_string(a.micro_batch);
  if (chunked) label += static_cast<char>('a' + a.chunk);
  if (a.is_compute()) return label;
  const bool send = a.kind == K::kSendActivation || a.kind == K::kSendGrad;
  label += send ? '>' : '<';
  label += std::to_string(a.peer);
  return label;
}

namespace {

bool is_chunked(const Schedule& schedule) {
  for (const auto& actions : schedule) {
    for (const Action& a : actions) {
      if (a.chunk != 0) return true;
    }
  }
  return false;
}

}  // namespace

std::string format_schedule(const Schedule& schedule) {
  const bool chunked = is_chunked(schedule);
  std::string text;
  for (size_t rank = 0; rank < schedule.size(); ++rank) {
    text += "rank " + std::to_string(rank) + ":";
    for (const Action& a : schedule[rank]) {
      if (!a.is_compute()) continue;
      text += ' ';
      text += action_label(a, chunked);
    }
    text += "\n";
  }
  return text;
}

std::string format_timeline(const Schedule& schedule, const StepCosts& costs, StageOrder order) {
  const ScheduleTiming timing = simulate_schedule(schedule, costs, order);
  const bool chunked = is_chunked(schedule);
  const auto cells = static_cast<size_t>(std::lround(timing.makespan));
  std::vector<std::vector<std::string>> rows(schedule.size(), std::vector<std::string>(cells, "."));
  size_t width = 1;
  for (size_t rank = 0; rank < schedule.size(); ++rank) {
    const RankTiming& t = timing.ranks[rank];
    for (size_t i = 0; i < schedule[rank].size(); ++i) {
      const Action& a = schedule[rank][i];
      if (!a.is_compute()) continue;
      const std::string label = action_label(a, chunked);
      width = std::max(width, label.size());
      const long first = std::lround(t.action_start[i]), last = std::lround(t.action_end[i]);
      for (long c = first; c < last; ++c) rows[rank][static_cast<size_t>(c)] = label;
    }
  }
  std::string text;
  for (size_t rank = 0; rank < rows.size(); ++rank) {
    text += "rank " + std::to_string(rank) + ":";
    for (const std::string& cell : rows[rank])
      text += " " + cell + std::string(width - cell.size(), ' ');
    while (!text.empty() && text.back() == ' ') text.pop_back();
    text += "\n";
  }
  return text;
}

}  // namespace shardlab::parallel
