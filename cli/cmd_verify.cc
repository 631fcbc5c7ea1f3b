// `shardlab verify`: train a sharded config and the unsharded reference from
// the same seed and batches, side by side, and compare them number by number.
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "cli/train_flags.h"
#include "collectives/mesh.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"
#include "runtime/transport.h"

namespace shardlab::cli {
namespace {

struct VerifyFlags {
  TrainFlags train;
  bool grads = false;
  std::optional<double> tol_loss, tol_param;  // unset: from the noise floor
};

// The floor and the tolerances it gives, in two lines.
void print_tolerances(const train::VerifyOptions& vo) {
  const train::NoiseFloor& f = vo.floor;
  if (f.measured) {
    std::string runs = f.reversed ? "the second with every micro-batch's sequences in reverse order"
                       : f.resplit != f.micro_batches
                           ? fmt::format("--micro-batches {} and {}", f.micro_batches, f.resplit)
                           : std::string("the second");
    if (f.split_sums)
      runs += std::string(f.reversed ? " and" : f.resplit != f.micro_batches ? ", the second with" : " with") +
              " every GEMM's sum over K in two halves (as tp and cp split theirs)";
    fmt::print("noise floor: two unsharded runs, {} (only the order of the sums differs), "
               "drift apart by loss rel diff {:.3e}, parameter rel L2 {:.3e} over {} steps; factor {:g}\n",
               runs, f.loss, f.param, f.steps, vo.floor_factor);
  } else {
    fmt::print("noise floor: not measured ({})\n", f.note);
  }
  auto source = [&](bool given, double drift) -> std::string {
    if (given) return "given";
    if (!f.measured) return "default";
    return vo.floor_factor * drift > train::kDefaultTolerance ? fmt::format("{:g} x floor", vo.floor_factor)
                                                               : fmt::format("default; {:g} x floor is less", vo.floor_factor);
  };
  fmt::print("tolerances: loss {:.3g} ({}), parameters {:.3g} ({}){}\n", vo.tol_loss, source(vo.user_tol_loss, f.loss),
             vo.tol_param, source(vo.user_tol_param, f.param),
             vo.grads ? fmt::format(", step-0 gradients {:.3g} (no drift to scale for)", vo.tol_grad) : "");
}

// The routing divergences and what was compared instead.
void print_routing(const train::VerifyResult& r, const train::TrainOptions& o) {
  auto counts = [](const train::RoutingDivergence& d) {
    return fmt::format("MoE block {} sent tokens per expert {} against {} (unsharded)", d.layer,
                       fmt::join(d.sharded, " "), fmt::join(d.reference, " "));
  };
  if (r.routing) fmt::print("routing diverged at step {}: {}\n", r.routing->step, counts(*r.routing));
  if (r.floor_routing)
    fmt::print("the noise floor's run diverged in routing at step {}: {}; the floor is its drift before that "
               "step\n",
               r.floor_routing->step, counts(*r.floor_routing));
  if (!r.routing || r.routing->step == 0) return;
  if (r.passed && r.routing->step == o.steps)
    fmt::print("  every step before it agrees within the tolerance, so a router's near-tie flipped on fp32 rounding; "
               "from there the runs route differently.\n");
  fmt::print("  The runs were trained again to step {} (the {}-step run's learning-rate schedule) and compared "
             "there: steps 0-{} and the parameters step {} started from.\n",
             o.steps, o.schedule_steps, o.steps - 1, o.steps);
}

// `sharded_model`: the run ran the sharded model (train::runs_sharded; on
// one device too, e.g. with model chunks or recomputation), not the
// unsharded reference itself.
void print_table(const train::TrainOptions& o, const collectives::DeviceMesh& mesh, const train::VerifyResult& r,
                 bool sharded_model) {
  const train::VerifyOptions& vo = r.options;
  fmt::print("shardlab verify: {} ({} devices) against the unsharded model, {} steps, {}\n", mesh.to_string(),
             mesh.size(), o.schedule_steps > 0 ? o.schedule_steps : o.steps, o.model.to_string());
  if (o.model.vocab_padded()) fmt::print("{}; the reference uses the same rows\n", model::vocab_padding_note(o.model, o.parallel.tp));
  fmt::print("{:>6} {:>16} {:>16} {:>12}\n", "step", "loss", "reference", "rel diff");
  for (size_t s = 0; s < r.loss_rel_diff.size(); ++s)
    fmt::print("{:>6} {:>16.9f} {:>16.9f} {:>12.3e}\n", s, r.sharded_loss[s], r.reference_loss[s], r.loss_rel_diff[s]);
  auto worst = [](const std::vector<train::TensorDiff>& v) {
    return *std::max_element(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.rel_l2 < b.rel_l2; });
  };
  if (!r.grads.empty()) {
    const auto w = worst(r.grads);
    fmt::print("step-0 gradients: {} tensors, rel L2 {:.3e} (tensor with the largest: {} {:.3e})\n",
               r.grads.size(), r.grad_rel_l2, w.name, w.rel_l2);
  }
  const auto w = worst(r.params);
  fmt::print("parameters after step {}: {} tensors, rel L2 {:.3e}, max |diff| {:.3e} (tensor with the largest rel L2: {} {:.3e})\n",
             o.steps - 1, r.params.size(), r.param_rel_l2, r.max_param_abs_diff, w.name, w.rel_l2);
  if (!r.flips.empty()) {
    std::string list;
    for (size_t i = 0; i < r.flips.size() && i < 3; ++i)
      list += fmt::format("{}{}[{}] {:.3e}", i ? ", " : "", r.flips[i].name, r.flips[i].index, r.flips[i].abs_diff);
    if (r.flips.size() > 3) list += fmt::format(" and {} more", r.flips.size() - 3);
    fmt::print("set aside as AdamW flips (an element whose gradient is at rounding level steps by up to lr either "
               "way; at most {} elements, each {:.3g} to {:.3g} apart): {}; the rest of the vector: rel L2 {:.3e}\n",
               r.flip_limit, vo.flips.min, vo.flips.max, list,
               r.param_rel_l2_held);
  }
  if (r.tp_replicas && r.tp_drift.empty())
    fmt::print("tp-replicated tensors (norms, row-parallel biases, wpe, replicated K/V, routers): every tp rank's "
               "copy is tp rank 0's, bit for bit\n");
  else if (r.tp_replicas)
    fmt::print("tp-replicated tensors drift apart: {} differs from tp rank 0's copy (max |diff| {:.3e} over the tp "
               "ranks); expected by rounding where the tp ranks' data-parallel groups sit differently on the nodes "
               "(their reductions run other algorithms, as NCCL's per-communicator choices would); not a failure: "
               "this comparison and the checkpoints use tp rank 0's copies\n",
               r.tp_drift, r.tp_drift_max);
  print_tolerances(vo);
  if (r.routing || r.floor_routing) print_routing(r, o);
  if (r.passed && !sharded_model) {
    fmt::print("PASS, vacuously: nothing is sharded (1 device, no dp, tp, cp or pp split), so the run is the "
               "unsharded model compared with itself\n");
    return;
  }
  if (r.passed) {
    fmt::print("PASS: matches the unsharded model (loss rel diff <= {:.3g} per step, parameter-vector rel L2 <= {:.3g})\n",
               vo.tol_loss, vo.tol_param);
    return;
  }
  const auto& m = *r.first_mismatch;
  if (m.kind == "routing") {
    fmt::print("FAIL: the routing differs at step 0, before any training step: the sharded model routes tokens to "
               "other experts than the unsharded one from the same parameters (a near-tie at initialization is "
               "possible but rare: try another --seed)\n");
  } else if (m.kind == "replica") {
    fmt::print("FAIL: data-parallel replicas differ: {} differs from dp rank 0's copy by {:.3e}\n", m.name, m.value);
  } else if (m.kind == "loss") {
    fmt::print("FAIL: the loss of step {} differs: rel diff {:.3e} > {:.3g} (|diff| {:.3e})\n", m.step, m.value,
               vo.tol_loss, m.max_abs);
  } else {
    const bool flips = m.kind == "param" && !r.flips.empty();
    fmt::print("FAIL: {} differ (rel L2 {:.3e}{} > {:.3g}); first mismatch: {}{}, max |diff| {:.3e}\n",
               m.kind == "grad" ? "the step-0 gradients" : "the parameters", m.value,
               flips ? fmt::format(" with {} AdamW flip{} set aside", r.flips.size(), r.flips.size() > 1 ? "s" : "")
                     : std::string(),
               m.kind == "grad" ? vo.tol_grad : vo.tol_param, m.name,
               m.layer >= 0 ? fmt::format(" (layer {})", m.layer) : "", m.max_abs);
  }
}

// Runs the first of `runs` here and the others on host threads of their
// own, side by side, and rethrows the first error. std::threads, not oneTBB
// tasks: their join is a synchronisation ThreadSanitizer sees (Debian's
// oneTBB is not instrumented, so the reads of results after a TBB join were
// reported as races).
void side_by_side(const std::vector<std::function<void()>>& runs) {
  std::vector<std::exception_ptr> errors(runs.size());
  auto guarded = [&](size_t i) {
    try {
      runs[i]();
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> others;
  for (size_t i = 1; i < runs.size(); ++i) others.emplace_back(guarded, i);
  guarded(0);
  for (std::thread& t : others) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// The floor run (micro_batches 0: none, with the reason in floor.note).
train::FloorRun floor_run(const VerifyFlags& f, const train::TrainOptions& sharded,
                          const train::TrainOptions& reference, train::NoiseFloor& floor) {
  floor.micro_batches = reference.micro_batches;
  if (sharded.parallel.world() == 1) {
    floor.note = "nothing is sharded";
    return {};
  }
  if (f.tol_loss && f.tol_param) {
    floor.note = "--tol-loss and --tol-param were given";
    return {};
  }
  // tp splits the matmuls' inner sums over its ranks, cp the attention's over
  // the sequence's chunks: the floor run's GEMMs split theirs too.
  const bool split_sums = sharded.parallel.tp > 1 || sharded.parallel.cp > 1;
  return train::floor_run(reference, split_sums, floor.note);
}

int run_verify(VerifyFlags& f) {
  HardwareProfile profile = f.train.profile();
  train::TrainOptions sharded = f.train.options();
  if (sharded.phantom)
    throw ConfigError("--phantom: verify compares values, and a phantom run computes none (use train --phantom)");
  if (!f.train.opts.save_path.empty())
    throw ConfigError("--save: verify trains two models and keeps neither (use train --save)");
  check_outputs({{"--report", f.train.report}, {"--trace", f.train.common.trace}});
  sharded.keep_step0_grads = f.grads;
  train::TrainOptions reference = sharded;
  reference.parallel = {};
  // The hand-written unsharded model (model/gpt.h) as the reference: its
  // numbers are the fused kernel's (only the charged time differs), and
  // the fused kernel would run the sharded model (runs_sharded).
  reference.parallel.attention = parallel::AttentionKernel::kUnfused;
  reference.corrupt_shard.clear();
  train::NoiseFloor floor;
  const train::FloorRun floor_plan = floor_run(f, sharded, reference, floor);
  train::TrainOptions resplit = reference;  // the noise floor's run
  resplit.micro_batches = floor_plan.micro_batches;
  resplit.reverse_rows = floor_plan.reversed;
  resplit.split_sums = floor_plan.split_sums;
  resplit.keep_step0_grads = false;

  const ClusterOptions sharded_copts = f.train.cluster_options();
  ClusterOptions copts = sharded_copts;
  Cluster sharded_cluster(profile, copts);
  copts.world_size = 1;
  copts.trace = false;
  copts.faults.reset();  // faults change the sharded run's clock, never its numbers
  copts.single_process = true;  // under mpirun every process runs the reference itself
  Cluster reference_cluster(profile, copts), resplit_cluster(profile, copts);
  train::TrainResult a, b, c;
  std::vector<std::function<void()>> runs{[&] { a = train::train(sharded_cluster, sharded); },
                                          [&] { b = train::train(reference_cluster, reference); }};
  if (resplit.micro_batches > 0) runs.emplace_back([&] { c = train::train(resplit_cluster, resplit); });
  side_by_side(runs);
  const nlohmann::json report = train::report_json(sharded, sharded_cluster, a);
  if (leader_process())  // under mpirun, one set of files (runtime/transport.h)
    write_outputs({{"--report", f.train.report, f.train.report.empty() ? "" : report.dump(2) + "\n"},
                   {"--trace", f.train.common.trace,
                    f.train.common.trace.empty() ? "" : chrome_trace_json(a.run.traces, "shardlab verify (sharded run)")}});
  const model::ParamTable table(sharded.model);
  // MoE: once a router's near-tie flips, two runs route differently and
  // part for that reason alone (RoutingDivergence). The sharded run and the
  // reference are compared up to the step at which the sharded run's
  // routing diverged from the reference's: both re-run there on the full
  // run's learning-rate schedule, every step before it compared, and the
  // parameters it started from. The floor is measured the same way, up to
  // the first divergence of the floor run's own routing if that comes
  // first (a drift that includes another route would make the tolerance
  // that route's, not the reordered sums'): it is then a little lower than
  // over all the steps compared, never inflated.
  const std::optional<train::RoutingDivergence> routing = train::routing_divergence(a, b);
  std::optional<train::RoutingDivergence> floor_routing;
  if (resplit.micro_batches > 0) floor_routing = train::routing_divergence(c, b);
  int horizon = sharded.steps;
  if (routing && routing->step > 0) horizon = routing->step;
  if (floor_routing && floor_routing->step >= horizon) floor_routing.reset();
  if (floor_routing && floor_routing->step == 0) {  // no drift before it to measure: the note says why
    resplit.micro_batches = 0;
    floor.note = "the floor run's routing differs from the reference's at step 0";
    floor_routing.reset();
  }
  auto stop = [&](train::TrainOptions o, int steps) {
    o.steps = steps;
    o.schedule_steps = sharded.steps;
    return o;
  };
  if (resplit.micro_batches > 0 && floor_routing) {  // the floor up to its own divergence
    train::TrainResult ref_f, floor_f;
    Cluster reference_f(profile, copts), floor_cluster_f(profile, copts);
    side_by_side({[&] { ref_f = train::train(reference_f, stop(reference, floor_routing->step)); },
                  [&] { floor_f = train::train(floor_cluster_f, stop(resplit, floor_routing->step)); }});
    floor = train::measure_floor(ref_f, floor_f, table, reference.micro_batches, floor_plan,
                                 train::adam_flip_bounds(ref_f, reference.adam));
  }
  train::TrainOptions compared = sharded;
  if (horizon < sharded.steps && !(routing && routing->step == 0)) {
    compared = stop(sharded, horizon);
    const train::TrainOptions ref_to = stop(reference, horizon), floor_to = stop(resplit, horizon);
    Cluster sharded_again(profile, sharded_copts), reference_again(profile, copts), floor_again(profile, copts);
    std::vector<std::function<void()>> again{[&] { a = train::train(sharded_again, compared); },
                                             [&] { b = train::train(reference_again, ref_to); }};
    if (resplit.micro_batches > 0 && !floor_routing)
      again.emplace_back([&] { c = train::train(floor_again, floor_to); });
    side_by_side(again);
  }
  if (resplit.micro_batches > 0 && !floor_routing)
    floor = train::measure_floor(b, c, table, reference.micro_batches, floor_plan,
                                 train::adam_flip_bounds(b, reference.adam));
  train::VerifyOptions vo = train::floor_options(floor, train::floor_factor_for(floor.split_sums), f.tol_loss, f.tol_param, f.grads);
  vo.flips = train::adam_flip_bounds(b, reference.adam);
  train::VerifyResult r = train::compare_runs(a, b, table, vo);
  r.routing = routing;
  r.floor_routing = floor_routing;
  if (routing && routing->step == 0) {
    r.first_mismatch = train::Mismatch{"routing", "", routing->layer, 0, 0, 0};
    r.passed = false;
  }
  const bool sharded_model = sharded.parallel.world() > 1 || train::runs_sharded(sharded, sharded_copts.precision);
  if (f.train.common.json) {
    nlohmann::json j = train::verify_json(r);
    j["sharded"] = sharded_model;
    print_json(j);
  } else {
    const collectives::DeviceMesh mesh(sharded.parallel.mesh_shape());
    print_table(compared, mesh, r, sharded_model);
    fmt::print("sharded run on {}:\n", profile.name);
    print_device_table(report);
  }
  return r.passed ? 0 : 1;
}

#define FIELD(path) FLAG_FIELD(VerifyFlags, path)

FlagTable<VerifyFlags> verify_flags() {
  return {
      {"--grads", FIELD(grads), "Also compare the step-0 gradients (against --tol-param, or 1e-5)"},
      {"--tol-loss", FIELD(tol_loss),
       fmt::format("Max relative loss difference per step (default: the larger of 1e-5 and {:g} x the noise "
                   "floor, {:g} x with --tp or --cp)",
                   train::kFloorFactor, train::kSplitFloorFactor),
       number_in(0, 1e3)},
      {"--tol-param", FIELD(tol_param),
       fmt::format("Max relative L2 difference of the whole parameter vector, ||sharded - reference|| / "
                   "||reference|| (default: the larger of 1e-5 and {:g} x the noise floor, {:g} x with --tp or --cp)",
                   train::kFloorFactor, train::kSplitFloorFactor),
       number_in(0, 1e3)},
  };
}

#undef FIELD

}  // namespace

void add_verify_command(CLI::App& app) {
  auto* sub = app.add_subcommand("verify", "Train a sharded config and the unsharded model; compare them");
  auto f = std::make_shared<VerifyFlags>();
  f->train.add(sub);
  sub->get_option("--corrupt-shard")
      ->description("Testing verify: perturb rank RANK's shard of parameter NAME, by 1e-2 x (1 + |x|) after the "
                    "last step, or with REL scaled by 1 + REL before the first step (verify must then FAIL)")
      ->option_text("NAME:RANK[:REL]")
      ->group("Options");
  add_flags(sub, *f, verify_flags());
  sub->footer("Noise floor: the drift between the unsharded model and the same run split into other micro-batches "
              "(only the order of the fp32 sums differs), over the same steps; with --tp or --cp its GEMMs also sum "
              "over K in two halves, as those split them; printed with the tolerances.\n"
              "Exit status: 0 when the runs agree, 1 when they do not, 2 on bad input.");
  set_action(sub, [f] { return run_verify(*f); });
}

}  // namespace shardlab::cli
