#include "model/train/verify.h"

#include "runtime/errors.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include <nlohmann/json.hpp>

namespace shardlab::train {
namespace {

// grads: the step-0 gradients, without the router biases' slots (a load
// signal, not a gradient: scaled by the data-parallel mean, its sign is what counts).
std::vector<TensorDiff> diff_tensors(const std::vector<float>& a, const std::vector<float>& b,
                                     const model::ParamTable& table, bool grads = false) {
  std::vector<TensorDiff> out;
  for (const auto& s : table.specs()) {
    if (grads && s.role == model::ParamRole::kRouterBias) continue;
    TensorDiff d{s.name, s.layer};
    double num = 0, den = 0;
    for (int64_t i = 0; i < s.numel; ++i) {
      const double x = a[size_t(s.offset + i)], y = b[size_t(s.offset + i)];
      const double e = std::abs(x - y);
      if (e > d.max_abs || std::isnan(e)) {
        d.max_abs = e;
        d.argmax = i;
      }
      num += (x - y) * (x - y);
      den += y * y;
    }
    d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    d.diff_l2 = std::sqrt(num);
    d.ref_l2 = std::sqrt(den);
    out.push_back(d);
  }
  return out;
}

// ||a - b|| / ||b|| over every tensor.
double global_rel_l2(const std::vector<TensorDiff>& diffs) {
  double num = 0, den = 0;
  for (const auto& d : diffs) {
    num += d.diff_l2 * d.diff_l2;
    den += d.ref_l2 * d.ref_l2;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// When the whole vector is beyond tolerance: the first tensor, in table order,
// whose own difference alone breaks it, else the one that differs most.
std::optional<Mismatch> first_bad(const std::vector<TensorDiff>& diffs, const char* kind, double tol) {
  const double rel = global_rel_l2(diffs);
  if (rel <= tol) return std::nullopt;
  double den = 0;
  for (const auto& d : diffs) den += d.ref_l2 * d.ref_l2;
  const double budget = tol * std::sqrt(den);
  const TensorDiff* pick = nullptr;
  for (const auto& d : diffs) {
    if (!(d.diff_l2 <= budget)) {
      pick = &d;
      break;
    }
  }
  if (!pick) pick = &*std::max_element(diffs.begin(), diffs.end(),
                                       [](const auto& a, const auto& b) { return a.diff_l2 < b.diff_l2; });
  return Mismatch{kind, pick->name, pick->layer, -1, rel, pick->max_abs};
}

// Up to k elements, largest difference first, each within `bounds`; then
// `diffs` (the parameters) without them.
std::vector<ParamFlip> set_aside_flips(const std::vector<float>& a, const std::vector<float>& b,
                                       const model::ParamTable& table, FlipBounds bounds, size_t k,
                                       std::vector<TensorDiff>& diffs) {
  if (k == 0) return {};
  using Entry = std::pair<double, int64_t>;  // |diff|, flat index; a min-heap of the k largest
  std::vector<Entry> heap;
  heap.reserve(k + 1);
  const auto cmp = std::greater<Entry>();
  for (size_t i = 0; i < b.size() && i < a.size(); ++i) {
    const double e = std::abs(double(a[i]) - double(b[i]));
    if (!(e > 0 && e >= bounds.min && e <= bounds.max)) continue;
    if (heap.size() == k && !(e > heap.front().first)) continue;
    heap.emplace_back(e, int64_t(i));
    std::push_heap(heap.begin(), heap.end(), cmp);
    if (heap.size() > k) {
      std::pop_heap(heap.begin(), heap.end(), cmp);
      heap.pop_back();
    }
  }
  std::sort(heap.begin(), heap.end(), [](const Entry& x, const Entry& y) { return x.first > y.first; });
  std::vector<ParamFlip> flips;
  const auto& specs = table.specs();
  for (const auto& [e, i] : heap) {
    for (size_t t = 0; t < specs.size(); ++t) {
      const auto& s = specs[t];
      if (i < s.offset || i >= s.offset + s.numel) continue;
      flips.push_back({s.name, i - s.offset, e});
      TensorDiff& d = diffs[t];
      d.diff_l2 = std::sqrt(std::max(0.0, d.diff_l2 * d.diff_l2 - e * e));
      d.rel_l2 = d.ref_l2 > 0 ? d.diff_l2 / d.ref_l2 : d.diff_l2;
      break;
    }
  }
  return flips;
}

}  // namespace

FlipBounds adam_flip_bounds(const TrainResult& run, const model::AdamWHyper& adam) {
  const double per_lr = std::max(1.0, (1 - adam.beta1) / std::sqrt(1 - adam.beta2));
  double sum = 0, most = 0;
  for (const StepRecord& s : run.steps) {
    sum += s.lr;
    most = std::max(most, s.lr);
  }
  return {0.1 * most, 2 * per_lr * sum};
}

namespace {
// The batch's part of the floor run: a split or a reordering of the batch
// that changes only the order of the sums, if there is one.
FloorRun batch_floor_run(const TrainOptions& reference, std::string& note) {
  const model::GPTConfig& m = reference.model;
  if (m.is_moe() && m.capacity_factor > 0) {
    note = "MoE with an expert capacity: which tokens overflow depends on their order and split";
    return {};
  }
  if (m.is_moe() && m.aux_coef != 0) {
    if (m.batch_size / reference.micro_batches > 1) return {reference.micro_batches, true};
    note = "MoE with a load-balancing loss (per micro-batch) and micro-batches of one sequence: no split or "
           "reordering changes only the order of the sums";
    return {};
  }
  if (reference.micro_batches > 1) return {1, false};
  for (int d = 2; d <= m.batch_size; ++d)
    if (m.batch_size % d == 0) return {d, false};
  note = "a batch of one sequence cannot be split into micro-batches";
  return {};
}
}  // namespace

FloorRun floor_run(const TrainOptions& reference, bool split_sums, std::string& note) {
  FloorRun run = batch_floor_run(reference, note);
  if (!split_sums) return run;
  if (run.micro_batches == 0) {
    run.micro_batches = reference.micro_batches;  // the split sums alone
    note.clear();
  }
  run.split_sums = true;
  return run;
}

NoiseFloor measure_floor(const TrainResult& reference, const TrainResult& resplit, const model::ParamTable& table,
                         int micro_batches, const FloorRun& run, FlipBounds flips) {
  VerifyOptions o;
  o.flips = flips;
  const VerifyResult r = compare_runs(resplit, reference, table, o);
  NoiseFloor f;
  f.measured = true;
  f.reversed = run.reversed;
  f.split_sums = run.split_sums;
  f.micro_batches = micro_batches;
  f.resplit = run.micro_batches;
  f.steps = int(r.loss_rel_diff.size());
  f.loss = r.max_loss_rel_diff;
  f.param = r.param_rel_l2_held;
  return f;
}

VerifyOptions floor_options(const NoiseFloor& floor, double factor, std::optional<double> tol_loss,
                            std::optional<double> tol_param, bool grads) {
  VerifyOptions o;
  o.grads = grads;
  o.floor = floor;
  o.floor_factor = factor;
  o.user_tol_loss = tol_loss.has_value();
  o.user_tol_param = tol_param.has_value();
  const auto scaled = [&](double drift) {
    return floor.measured ? std::max(kDefaultTolerance, factor * drift) : kDefaultTolerance;
  };
  o.tol_loss = tol_loss ? *tol_loss : scaled(floor.loss);
  o.tol_param = tol_param ? *tol_param : scaled(floor.param);
  o.tol_grad = tol_param ? *tol_param : kDefaultTolerance;
  return o;
}

VerifyResult compare_runs(const TrainResult& sharded, const TrainResult& reference,
                          const model::ParamTable& table, const VerifyOptions& o) {
  if (sharded.final_params.empty() || reference.final_params.empty())
    throw ConfigError("verify compares values: a phantom run (or one without parameters) has none");
  VerifyResult r;
  r.options = o;
  for (size_t s = 0; s < reference.steps.size() && s < sharded.steps.size(); ++s) {
    const double a = sharded.steps[s].loss, b = reference.steps[s].loss;
    const double rel = std::abs(a - b) / std::max(std::abs(b), 1e-30);
    r.sharded_loss.push_back(a);
    r.reference_loss.push_back(b);
    r.loss_rel_diff.push_back(rel);
    r.max_loss_rel_diff = std::max(r.max_loss_rel_diff, rel);
    if (!(rel <= o.tol_loss) && !r.first_mismatch) r.first_mismatch = Mismatch{"loss", "", -1, int(s), rel, std::abs(a - b)};
  }
  if (o.grads) {
    r.grads = diff_tensors(sharded.step0_grads, reference.step0_grads, table, /*grads=*/true);
    r.grad_rel_l2 = global_rel_l2(r.grads);
    if (!r.first_mismatch) r.first_mismatch = first_bad(r.grads, "grad", o.tol_grad);
  }
  r.params = diff_tensors(sharded.final_params, reference.final_params, table);
  r.param_rel_l2 = global_rel_l2(r.params);
  for (const auto& d : r.params) r.max_param_abs_diff = std::max(r.max_param_abs_diff, d.max_abs);
  std::vector<TensorDiff> held = r.params;
  if (o.flips.max > 0) r.flip_limit = flip_limit(reference.final_params.size());
  r.flips = set_aside_flips(sharded.final_params, reference.final_params, table, o.flips, r.flip_limit, held);
  r.param_rel_l2_held = global_rel_l2(held);
  if (!r.first_mismatch) r.first_mismatch = first_bad(held, "param", o.tol_param);
  if (!r.first_mismatch && !sharded.replica_mismatch.empty()) {
    r.first_mismatch = Mismatch{"replica", sharded.replica_mismatch, -1, -1, sharded.replica_max_diff,
                                sharded.replica_max_diff};
  }
  r.tp_replicas = !sharded.tp_replicated.empty();
  r.tp_drift = sharded.tp_drift;
  r.tp_drift_max = sharded.tp_drift_max;
  r.passed = !r.first_mismatch.has_value();
  return r;
}

std::optional<RoutingDivergence> routing_divergence(const TrainResult& sharded, const TrainResult& reference) {
  std::optional<RoutingDivergence> first;
  for (const auto& a : sharded.moe_layers) {
    auto b = std::find_if(reference.moe_layers.begin(), reference.moe_layers.end(),
                          [&](const TrainResult::MoeLayerSteps& m) { return m.layer == a.layer; });
    if (b == reference.moe_layers.end()) continue;
    const size_t steps = std::min(a.tokens.size(), b->tokens.size());
    for (size_t s = 0; s < steps; ++s) {
      if (a.tokens[s] == b->tokens[s]) continue;
      if (!first || int(s) < first->step) first = RoutingDivergence{int(s), a.layer, a.tokens[s], b->tokens[s]};
      break;
    }
  }
  return first;
}

nlohmann::json verify_json(const VerifyResult& r) {
  nlohmann::json j{{"passed", r.passed},
                   {"max_loss_rel_diff", r.max_loss_rel_diff},
                   {"max_param_abs_diff", r.max_param_abs_diff},
                   {"param_rel_l2", r.param_rel_l2},
                   {"param_rel_l2_held", r.param_rel_l2_held},
                   {"first_mismatch", nullptr},
                   {"tp_replica_drift", nullptr}};
  if (r.tp_replicas)
    j["tp_replica_drift"] = {{"max_abs_diff", r.tp_drift_max},
                             {"first", r.tp_drift.empty() ? nlohmann::json() : nlohmann::json(r.tp_drift)}};
  if (r.first_mismatch) {
    const Mismatch& m = *r.first_mismatch;
    j["first_mismatch"] = {{"kind", m.kind}, {"name", m.name}, {"layer", m.layer}, {"step", m.step},
                           {"rel_diff", m.value}, {"max_abs_diff", m.max_abs}};
  }
  const VerifyOptions& o = r.options;
  const NoiseFloor& f = o.floor;
  j["floor_factor"] = o.floor_factor;
  j["flip_bound"] = o.flips.max;
  j["flip_min"] = o.flips.min;
  j["adam_flips"] = nlohmann::json::array();
  for (const ParamFlip& f : r.flips)
    j["adam_flips"].push_back({{"name", f.name}, {"index", f.index}, {"abs_diff", f.abs_diff}});
  j["noise_floor"] = {{"measured", f.measured}};
  if (f.measured) {
    j["noise_floor"]["micro_batches"] = {f.micro_batches, f.resplit};
    j["noise_floor"]["reversed_rows"] = f.reversed;
    j["noise_floor"]["split_sums"] = f.split_sums;
    j["noise_floor"]["steps"] = f.steps;
    j["noise_floor"]["max_loss_rel_diff"] = f.loss;
    j["noise_floor"]["param_rel_l2"] = f.param;
  } else {
    j["noise_floor"]["note"] = f.note;
  }
  j["tolerances"] = {{"loss", o.tol_loss}, {"param", o.tol_param}, {"grad", o.tol_grad},
                     {"loss_given", o.user_tol_loss}, {"param_given", o.user_tol_param}};
  auto divergence = [](const std::optional<RoutingDivergence>& d) -> nlohmann::json {
    if (!d) return nullptr;
    return {{"step", d->step}, {"layer", d->layer}, {"tokens_per_expert", d->sharded},
            {"reference_tokens_per_expert", d->reference}};
  };
  j["routing_divergence"] = divergence(r.routing);
  j["floor_routing_divergence"] = divergence(r.floor_routing);
  j["steps"] = nlohmann::json::array();
  for (size_t s = 0; s < r.loss_rel_diff.size(); ++s)
    j["steps"].push_back({{"step", s}, {"loss", r.sharded_loss[s]}, {"reference_loss", r.reference_loss[s]},
                          {"rel_diff", r.loss_rel_diff[s]}});
  auto tensors = [](const std::vector<TensorDiff>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& d : v)
      a.push_back({{"name", d.name}, {"layer", d.layer}, {"max_abs_diff", d.max_abs}, {"rel_l2", d.rel_l2}});
    return a;
  };
  j["params"] = tensors(r.params);
  if (!r.grads.empty()) {
    j["grads"] = tensors(r.grads);
    j["grad_rel_l2"] = r.grad_rel_l2;
  }
  return j;
}

}  // namespace shardlab::train
