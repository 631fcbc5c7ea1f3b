// Lab 5 grader: checks your GPipe and 1F1B for pp 1..4 and M 1..8 with the
// library's validator (validate_schedule: peers, FIFO order, inputs before
// computes, deadlocks), the unit-time bubble of simulate_schedule (F 1, B 2)
// against (p-1)/(m+p-1), and the activations each rank holds
// (peak_in_flight: GPipe M, 1F1B min(pp - rank, M)); then trains the tiny
// model with your 1F1B on pp 2 and compares its losses with the built-in 1F1B.
// The same checks grade the C++ exercise (grader_main.cc) and the notebook's
// Python functions (python/lab_graders.cc).
#include "labs/05-pipeline-schedules/grader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "labs/common/grade.h"
#include "model/config.h"
#include "model/train/trainer.h"

namespace shardlab::labs {
namespace {

// Checks one (schedule, pp, M); `stash(rank)` is the activations rank may hold.
template <class Stash>
void grade_one(Grade& g, const char* name, const ScheduleFn& fn, int pp, int m, Stash stash) {
  const std::string what = fmt::format("{} pp={} M={}", name, pp, m);
  const parallel::Schedule s = fn(pp, m);
  if (!g.check(s.size() == static_cast<size_t>(pp), what + ": one action list per rank",
               fmt::format("{} lists", s.size())))
    return;
  const std::string fault = parallel::validate_schedule(s, m);
  if (!g.check(fault.empty(), what + ": valid", fault)) return;
  const double bubble = parallel::simulate_schedule(s).bubble_fraction;
  const double want = static_cast<double>(pp - 1) / (m + pp - 1);
  g.check(std::abs(bubble - want) <= 1e-12,
          what + fmt::format(": bubble (p-1)/(m+p-1) = {:.4f}", want),
          fmt::format(
              "bubble {:.4f} (|diff| {:.2e} > 1e-12): computes wait longer than the schedule needs",
              bubble, std::abs(bubble - want)));
  const std::vector<int> held = parallel::peak_in_flight(s);
  for (int r = 0; r < pp; ++r) {
    const int want_held = stash(pp, m, r);
    if (held[static_cast<size_t>(r)] != want_held) {
      g.check(false, what + ": activations held",
              fmt::format("rank {} holds {} micro-batches at its peak, want {}", r,
                          held[static_cast<size_t>(r)], want_held));
      return;
    }
  }
  g.check(true, what + ": activations held per rank");
}

// The same losses as the built-in 1F1B, on the real executor.
void grade_training(Grade& g, const ScheduleFn& one_f_one_b) {
  train::TrainOptions o;
  o.model = model::preset("tiny");
  o.steps = 2;
  o.micro_batches = 4;
  o.parallel.pp = 2;
  Cluster reference_cluster(load_profile("a100-nvlink"), {.world_size = 2});
  const train::TrainResult want = train::train(reference_cluster, o);
  o.parallel.custom_schedule = one_f_one_b(2, 4);
  if (!parallel::validate_schedule(*o.parallel.custom_schedule, 4).empty())
    return;  // reported above
  Cluster cluster(load_profile("a100-nvlink"), {.world_size = 2});
  const train::TrainResult got = train::train(cluster, o);
  bool same = got.steps.size() == want.steps.size();
  for (size_t i = 0; same && i < got.steps.size(); ++i)
    same = got.steps[i].loss == want.steps[i].loss;
  // On a mismatch: how far off, not the built-in's output.
  g.check(same, "tiny, pp 2, M 4, trained with your 1F1B: the built-in 1F1B's losses, bit for bit",
          fmt::format("the last loss differs by {:.3g}",
                      std::abs(double(got.steps.back().loss) - double(want.steps.back().loss))));
  g.check(got.run.makespan() == want.run.makespan(), "... and its virtual time",
          fmt::format("{:.3f} ms, {:+.3f} ms against the built-in 1F1B's",
                      to_seconds(got.run.makespan()) * 1e3,
                      to_seconds(got.run.makespan() - want.run.makespan()) * 1e3));
}

}  // namespace

int grade_schedules(const ScheduleFn& gpipe, const ScheduleFn& one_f_one_b, std::string* out) {
  Grade g(5, "pipeline schedules as data: GPipe and 1F1B", out);
  for (int pp : {1, 2, 4})
    for (int m : {1, 2, 4, 8}) {
      grade_one(g, "gpipe", gpipe, pp, m, [](int, int mb, int) { return mb; });
      grade_one(g, "1f1b", one_f_one_b, pp, m, [](int p, int mb, int r) { return std::min(p - r, mb); });
    }
  if (g.failures() == 0) grade_training(g, one_f_one_b);
  return g.finish();
}

}  // namespace shardlab::labs
