// The --report JSON (DESIGN's contract: config, steps, devices, summary) and
// the text timeline of a pipeline's first step.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/parallel/attention_kernel.h"
#include "model/train/parallel_plan.h"
#include "model/train/trainer.h"

namespace shardlab::train {

namespace {

char span_letter(parallel::ActionKind k) {
  switch (k) {
    case parallel::ActionKind::kForward: return 'F';
    case parallel::ActionKind::kBackwardWeight: return 'W';
    default: return 'B';
  }
}

}  // namespace

std::string format_pipeline_timeline(const TrainResult& r, const std::vector<int>& ranks, int width) {
  Time t0 = 0, t1 = 0;
  bool any = false;
  for (int rank : ranks) {
    for (const auto& s : r.first_step_spans[size_t(rank)]) {
      t0 = any ? std::min(t0, s.start) : s.start;
      t1 = any ? std::max(t1, s.end) : s.end;
      any = true;
    }
  }
  if (!any || t1 <= t0) return "";
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::string row(size_t(width), '.');
    for (int col = 0; col < width; ++col) {
      const Time mid = t0 + Time((double(col) + 0.5) * double(t1 - t0) / width);
      for (const auto& s : r.first_step_spans[size_t(ranks[i])])
        if (s.start <= mid && mid < s.end) row[size_t(col)] = span_letter(s.kind);
    }
    out += fmt::format("stage {:>2} |{}|\n", i, row);
  }
  return out;
}

namespace {

// One device: mesh position, memory peaks by kind, the time split, and its
// MoE and pipeline records when it has them.
nlohmann::json device_json(const collectives::DeviceMesh& mesh, const ParallelOptions& p, const TrainResult& r,
                           const DeviceStats& d, Time makespan) {
  nlohmann::json peaks;
  for (int k = 0; k < kNumMemKinds; ++k) peaks[mem_kind_name(static_cast<MemKind>(k))] = d.peak_by_kind[k];
  // Time split: compute, communication not hidden under compute (the comm
  // stream's exposed part plus collectives run on the compute stream, TP's), idle.
  const Time compute = d.compute_busy - d.compute_transfer;
  const Time exposed = d.comm_exposed + d.compute_transfer;
  const Time idle = std::max<Time>(0, makespan - compute - exposed);
  const auto c = mesh.coords(d.rank);
  nlohmann::json j = {{"rank", d.rank}, {"node", d.node}, {"name", mesh.describe(d.rank)},
                      // ep: the device's place in its EP group (with whole experts, tp + tp·ep)
                      {"coords", {{"dp", c.dp}, {"tp", c.tp}, {"pp", c.pp}, {"ep", expert_rank(p, c)}, {"cp", c.cp}}},
                      {"peak_bytes", d.peak_bytes}, {"peak_bytes_by_kind", peaks},
                      {"capacity_bytes", d.capacity_bytes},
                      {"compute_s", to_seconds(compute)}, {"comm_s", to_seconds(exposed)},
                      {"comm_total_s", to_seconds(d.comm_busy + d.compute_transfer)},
                      {"idle_s", to_seconds(idle)}};
  const auto rank = size_t(d.rank);
  if (rank < r.moe.size() && !r.moe[rank].empty()) {
    nlohmann::json layers = nlohmann::json::array();
    uint64_t sent = 0, recv = 0, internode = 0;
    for (const MoeLayerTotals& t : r.moe[rank]) {
      layers.push_back({{"layer", t.layer}, {"expert_begin", t.expert_begin}, {"tokens_per_expert", t.received()},
                        {"dropped", t.dropped}, {"a2a_sent_bytes", t.a2a_sent_bytes},
                        {"a2a_recv_bytes", t.a2a_recv_bytes},
                        {"a2a_internode_sent_bytes", t.a2a_internode_sent_bytes}});
      sent += t.a2a_sent_bytes;
      internode += t.a2a_internode_sent_bytes;
      recv += t.a2a_recv_bytes;
    }
    const Time a2a = rank < r.a2a_time.size() ? r.a2a_time[rank] : 0;
    j["moe"] = {{"layers", layers}, {"a2a_sent_bytes", sent}, {"a2a_recv_bytes", recv},
                {"a2a_internode_sent_bytes", internode},
                {"a2a_s", to_seconds(a2a)},
                {"a2a_share_of_step", makespan > 0 ? double(a2a) / double(makespan) : 0.0}};
  }
  if (rank < r.fsdp.size()) {  // ZeRO-3's unit all-gathers over the whole run
    const TrainResult::FsdpTotals& f = r.fsdp[rank];
    j["fsdp"] = {{"gathers", f.gathers}, {"gathered_bytes", f.gathered_bytes},
                 {"gather_exposed_s", to_seconds(f.exposed)}, {"reduce_scatters", f.reduce_scatters}};
  }
  if (rank < r.param_gather.size()) {  // --overlap-param-gather's bucket all-gathers over the whole run
    const TrainResult::FsdpTotals& f = r.param_gather[rank];
    j["param_gather"] = {{"gathers", f.gathers}, {"gathered_bytes", f.gathered_bytes},
                         {"gather_exposed_s", to_seconds(f.exposed)}};
  }
  if (rank < r.cp.size()) {  // context parallelism's K/V exchange over the whole run
    j["cp"] = {{"sent_bytes", r.cp[rank].sent_bytes}, {"kv_exposed_s", to_seconds(r.cp[rank].exposed)}};
  }
  if (rank < r.phase_totals.size()) {
    const DevicePhaseTotals& t = r.phase_totals[rank];
    const Time window = t.busy + t.idle;
    j["fwd_bwd"] = {{"busy_s", to_seconds(t.busy)}, {"idle_s", to_seconds(t.idle)},
                    {"idle_fraction", window > 0 ? double(t.idle) / double(window) : 0.0},
                    {"p2p_sent_bytes", t.p2p_bytes}};
  }
  return j;
}

}  // namespace

nlohmann::json replicas_json(const TrainOptions& o, const TrainResult& r) {
  const auto first = [](const std::string& s) { return s.empty() ? nlohmann::json() : nlohmann::json(s); };
  nlohmann::json j{{"data_parallel_copies", o.parallel.data_ranks()},
                   {"identical", r.replica_mismatch.empty()},
                   {"first_difference", first(r.replica_mismatch)},
                   {"max_abs_diff", r.replica_max_diff},
                   {"tp_replica_drift", nullptr}};
  if (!r.tp_replicated.empty() && o.parallel.tp > 1)
    j["tp_replica_drift"] = {{"max_abs_diff", r.tp_drift_max}, {"first", first(r.tp_drift)}};
  return j;
}

std::string replica_failure(const TrainResult& r) {
  if (r.replica_mismatch.empty()) return "";
  return fmt::format("FAIL: data-parallel replicas differ: {} differs from dp rank 0's copy (max |diff| {:.3e}); "
                     "they must end bit-identical",
                     r.replica_mismatch, r.replica_max_diff);
}

std::vector<std::string> replica_lines(const TrainOptions& o, const TrainResult& r) {
  std::vector<std::string> lines;
  if (o.phantom) return lines;
  const int copies = o.parallel.data_ranks();
  const bool tied_copy = !r.tied_copy.empty();
  if (r.replica_mismatch.empty() && (copies > 1 || tied_copy)) {
    std::string what = copies > 1 ? fmt::format("the {} data-parallel copies of the parameters", copies) : "";
    if (tied_copy) what += std::string(what.empty() ? "" : " and ") + "the last stage's copy of the tied embedding";
    lines.push_back(fmt::format("replicas: {} are bit-identical after the last step", what));
  }
  if (!r.tp_replicated.empty() && o.parallel.tp > 1)
    lines.push_back(r.tp_drift.empty()
                        ? "tp-replicated tensors (norms, row-parallel biases, wpe, replicated K/V, routers): every tp "
                          "rank's copy is tp rank 0's, bit for bit"
                        : fmt::format("tp-replicated tensors drift apart by rounding: {} differs from tp rank 0's copy "
                                      "(max |diff| {:.3e}); a report, not a failure (checkpoints keep tp rank 0's)",
                                      r.tp_drift, r.tp_drift_max));
  return lines;
}

nlohmann::json report_json(const TrainOptions& o, const Cluster& cluster, const TrainResult& r) {
  nlohmann::json j;
  j["config"] = o.to_json();
  j["config"]["profile"] = cluster.profile().name;
  j["config"]["devices"] = cluster.world_size();
  j["config"]["precision"] = precision_name(cluster.options().precision);
  // The attention kernel the run charged (--attention, auto resolved by the family).
  j["config"]["attention"] =
      parallel::attention_kernel_name(parallel::fused_attention(o.parallel.attention, o.model.is_llama())
                                          ? parallel::AttentionKernel::kFused
                                          : parallel::AttentionKernel::kUnfused);
  // Whose published rates a fused kernel ran at, where the profile names it
  // (--attention-kernel; runtime/profile.h AttentionSpec).
  const AttentionSpec& kernel = cluster.profile().device.attention;
  if (j["config"]["attention"] == "fused" && !kernel.kernel.empty() && cluster.options().precision != Precision::kFp32)
    j["config"]["attention_kernel"] = kernel.kernel;
  if (o.model.vocab_padded()) j["config"]["model"]["vocab_padding"] = model::vocab_padding_note(o.model, o.parallel.tp);
  j["steps"] = nlohmann::json::array();
  for (const auto& s : r.steps) {
    j["steps"].push_back({{"step", s.step}, {"loss", s.loss}, {"ce_loss", s.ce}, {"aux_loss", s.aux},
                          {"lr", s.lr}, {"grad_norm", s.grad_norm},
                          {"virtual_time_s", to_seconds(s.virtual_end)}, {"wall_s", s.wall_s}});
  }
  const Time makespan = r.run.makespan();
  const collectives::DeviceMesh mesh(o.parallel.mesh_shape());
  j["config"]["mesh"] = mesh.to_string();
  j["devices"] = nlohmann::json::array();
  for (const auto& d : r.run.devices) j["devices"].push_back(device_json(mesh, o.parallel, r, d, makespan));
  const double step_s = to_seconds(makespan) / std::max<size_t>(1, r.steps.size());
  const double peak = CostModel(cluster.profile().device, cluster.options().precision).peak_flops();
  double hardware_flops = 0;
  for (const auto& d : r.run.devices) hardware_flops += d.compute_flops;
  hardware_flops /= double(std::max<size_t>(1, r.steps.size()));
  const double gpus = cluster.world_size();
  j["summary"] = {
      {"virtual_step_s", step_s},
      {"virtual_total_s", to_seconds(makespan)},
      {"host_tokens_per_s", r.loop_wall_s > 0 ? double(r.tokens_per_step) * r.steps.size() / r.loop_wall_s : 0},
      {"bubble_fraction", r.bubble_fraction},
      {"mfu", step_s > 0 ? r.model_flops_per_step / step_s / (peak * gpus) : 0},
      // Model FLOP/s per GPU (6N + 12LHQT per token, no recompute) and what
      // the GPUs really ran (every kernel's FLOPs, recomputation included).
      {"model_tflops_per_gpu", step_s > 0 ? r.model_flops_per_step / step_s / gpus / 1e12 : 0},
      {"hardware_flops_per_step", hardware_flops},
      {"hardware_tflops_per_gpu", step_s > 0 ? hardware_flops / step_s / gpus / 1e12 : 0},
      {"hfu", step_s > 0 ? hardware_flops / step_s / (peak * gpus) : 0},
      {"final_loss", r.steps.empty() ? 0 : r.steps.back().loss},
      {"n_params", r.n_params}};
  if (r.best_loss) j["summary"]["best_loss"] = *r.best_loss;
  if (!o.phantom) j["replicas"] = replicas_json(o, r);
  if (o.phantom) {
    j["phantom"] = {{"folded", r.folded}, {"running_devices", r.running_devices},
                    {"modeled", "every kernel, collective, transfer and arena allocation on the virtual "
                                "clock; no arithmetic, no data; losses are not computed; gradient "
                                "clipping assumed on"}};
    if (o.model.is_moe())
      j["phantom"]["routing"] =
          o.phantom_zipf > 0
              ? fmt::format("zipf:{}: token n's first expert e at quantile (n+0.5)/N of "
                            "p(e) ~ 1/(e+1)^{}, its k-th (e+k) mod E", o.phantom_zipf, o.phantom_zipf)
              : "uniform: token n's k-th expert is (n*K + k) mod E";
  }
  if (!r.moe_layers.empty()) {
    j["moe"] = nlohmann::json::array();
    double sum = 0;
    size_t count = 0;
    for (const auto& m : r.moe_layers) {
      j["moe"].push_back({{"layer", m.layer}, {"tokens_per_expert", m.tokens}, {"imbalance", m.imbalance}});
      for (double x : m.imbalance) sum += x, ++count;
    }
    j["summary"]["moe_imbalance"] = count ? sum / double(count) : 0.0;
  }
  return j;
}

}  // namespace shardlab::train
