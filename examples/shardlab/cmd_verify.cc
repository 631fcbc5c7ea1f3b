// `shardlab verify`: train a sharded config and the unsharded reference from
// the same seed and batches, side by side, and compare them number by number.
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tbb/parallel_invoke.h>

#include "collectives/mesh.h"
#include "examples/shardlab/cli.h"
#include "examples/shardlab/train_flags.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"

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

int run_verify(VerifyFlags& f) {
  HardwareProfile profile = apply_common(f.train.common);
  train::TrainOptions sharded = f.train.options();
  if (sharded.phantom)
    throw ConfigError("--phantom: verify compares values, and a phantom run computes none (use train --phantom)");
  sharded.keep_step0_grads = f.grads;
  train::TrainOptions reference = sharded;
  reference.parallel = {};
  reference.corrupt_shard.clear();
  reference.save_path.clear();
  sharded.save_path.clear();
  if (f.tol_loss < 0 || f.tol_param < 0) throw ConfigError("--tol-loss and --tol-param must be >= 0");
  const train::VerifyOptions vo{f.tol_loss, f.tol_param, f.grads};

  ClusterOptions copts = f.train.cluster_options();
  Cluster sharded_cluster(profile, copts);
  copts.world_size = 1;
  copts.trace = false;
  Cluster reference_cluster(profile, copts);
  train::TrainResult a, b;
  // Two independent emulations side by side.
  tbb::parallel_invoke([&] { a = train::train(sharded_cluster, sharded); },
                       [&] { b = train::train(reference_cluster, reference); });
  if (!f.train.common.trace.empty())
    write_chrome_trace(f.train.common.trace, a.run.traces, "shardlab verify (sharded run)");
  const nlohmann::json report = train::report_json(sharded, sharded_cluster, a);
  if (!f.train.report.empty()) {
    std::ofstream out(f.train.report);
    out << report.dump(2) << '\n';
    if (!out) throw ConfigError(fmt::format("--report: cannot write \"{}\"", f.train.report));
  }
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
  sub->add_option("--tol-loss", f.tol_loss, "Max relative loss difference per step")->capture_default_str();
  sub->add_option("--tol-param", f.tol_param, "Max relative L2 difference per tensor")->capture_default_str();
  sub->footer("Exit status: 0 when the runs agree, 1 when they do not, 2 on bad input.");
  set_action(sub, [] { return run_verify(f); });
}

}  // namespace shardlab::cli
