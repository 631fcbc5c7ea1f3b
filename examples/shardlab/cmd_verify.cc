// `shardlab verify`: train a sharded config and the unsharded reference from
// the same seed and batches, side by side, and compare them number by number.
#include <exception>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "collectives/mesh.h"
#include "examples/shardlab/cli.h"
#include "examples/shardlab/train_flags.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"
#include "runtime/transport.h"

namespace shardlab::cli {
namespace {

struct VerifyFlags {
  TrainFlags train;
  bool grads = false;
  double tol_loss = 1e-5;
  double tol_param = 1e-5;
};

void print_table(const train::TrainOptions& o, const collectives::DeviceMesh& mesh,
                 const train::VerifyResult& r, const train::VerifyOptions& vo) {
  fmt::print("shardlab verify: {} ({} devices) against the unsharded model, {} steps, {}\n", mesh.to_string(),
             mesh.size(), o.steps, o.model.to_string());
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
  if (r.passed) {
    fmt::print("PASS: matches the unsharded model (loss rel diff <= {:g} per step, parameter-vector rel L2 <= {:g})\n",
               vo.tol_loss, vo.tol_param);
    return;
  }
  const auto& m = *r.first_mismatch;
  if (m.kind == "replica") {
    fmt::print("FAIL: data-parallel replicas differ: {} differs from dp rank 0's copy by {:.3e}\n", m.name, m.value);
  } else if (m.kind == "loss") {
    fmt::print("FAIL: the loss of step {} differs: rel diff {:.3e} > {:g} (|diff| {:.3e})\n", m.step, m.value,
               vo.tol_loss, m.max_abs);
  } else {
    fmt::print("FAIL: {} differ (rel L2 {:.3e} > {:g}); first mismatch: {}{}, max |diff| {:.3e}\n",
               m.kind == "grad" ? "the step-0 gradients" : "the parameters", m.value, vo.tol_param, m.name,
               m.layer >= 0 ? fmt::format(" (layer {})", m.layer) : "", m.max_abs);
  }
}

// Runs `a` here and `b` on a second host thread, side by side, and rethrows
// the first error. A std::thread, not a oneTBB task: its join is a
// synchronisation ThreadSanitizer sees (Debian's oneTBB is not instrumented,
// so the reads of b's results after a TBB join were reported as races).
template <class A, class B>
void side_by_side(A&& a, B&& b) {
  std::exception_ptr error_a, error_b;
  std::thread other([&] {
    try {
      b();
    } catch (...) {
      error_b = std::current_exception();
    }
  });
  try {
    a();
  } catch (...) {
    error_a = std::current_exception();
  }
  other.join();
  if (error_a) std::rethrow_exception(error_a);
  if (error_b) std::rethrow_exception(error_b);
}

int run_verify(VerifyFlags& f) {
  HardwareProfile profile = apply_common(f.train.common);
  train::TrainOptions sharded = f.train.options();
  if (sharded.phantom)
    throw ConfigError("--phantom: verify compares values, and a phantom run computes none (use train --phantom)");
  if (!f.train.save.empty())
    throw ConfigError("--save: verify trains two models and keeps neither (use train --save)");
  check_outputs({{"--report", f.train.report}, {"--trace", f.train.common.trace}});
  sharded.keep_step0_grads = f.grads;
  train::TrainOptions reference = sharded;
  reference.parallel = {};
  reference.corrupt_shard.clear();
  const train::VerifyOptions vo{f.tol_loss, f.tol_param, f.grads};

  ClusterOptions copts = f.train.cluster_options();
  Cluster sharded_cluster(profile, copts);
  copts.world_size = 1;
  copts.trace = false;
  copts.faults.reset();  // faults change the sharded run's clock, never its numbers
  copts.single_process = true;  // under mpirun every process runs the reference itself
  Cluster reference_cluster(profile, copts);
  train::TrainResult a, b;
  side_by_side([&] { a = train::train(sharded_cluster, sharded); },
               [&] { b = train::train(reference_cluster, reference); });
  const nlohmann::json report = train::report_json(sharded, sharded_cluster, a);
  if (leader_process())  // under mpirun, one set of files (runtime/transport.h)
    write_outputs({{"--report", f.train.report, f.train.report.empty() ? "" : report.dump(2) + "\n"},
                   {"--trace", f.train.common.trace,
                    f.train.common.trace.empty() ? "" : chrome_trace_json(a.run.traces, "shardlab verify (sharded run)")}});
  const model::ParamTable table(sharded.model);
  const train::VerifyResult r = train::compare_runs(a, b, table, vo);
  if (f.train.common.json) {
    fmt::print("{}\n", train::verify_json(r).dump(2));
  } else {
    const collectives::DeviceMesh mesh(sharded.parallel.mesh_shape());
    print_table(sharded, mesh, r, vo);
    fmt::print("sharded run on {}:\n", profile.name);
    print_device_table(report);
  }
  return r.passed ? 0 : 1;
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto* sub = app.add_subcommand("verify", "Train a sharded config and the unsharded model; compare them");
  static VerifyFlags f;
  f.train.add(sub);
  sub->add_flag("--grads", f.grads, "Also compare the step-0 gradients");
  sub->add_option("--tol-loss", f.tol_loss, "Max relative loss difference per step")
      ->capture_default_str()
      ->check(number_in(0, 1e3));
  sub->add_option("--tol-param", f.tol_param, "Max relative L2 difference per tensor")
      ->capture_default_str()
      ->check(number_in(0, 1e3));
  sub->footer("Exit status: 0 when the runs agree, 1 when they do not, 2 on bad input.");
  set_action(sub, [] { return run_verify(f); });
}

}  // namespace shardlab::cli
