#include "model/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "collectives/mesh.h"
#include "model/engine/fold.h"
#include "model/engine/model_json.h"
#include "model/engine/shard_io.h"
#include "model/io/safetensors.h"
#include "model/parallel/config_check.h"
#include "model/parallel/layout.h"
#include "model/params.h"
#include "model/portable_math.h"
#include "model/train/checkpoint.h"
#include "model/train/device_program.h"
#include "model/train/parallel_plan.h"
#include "model/train/preflight.h"
#include "model/train/result_rows.h"
#include "runtime/errors.h"
#include "runtime/require.h"
#include "runtime/output_file.h"
#include "runtime/parse_number.h"
#include "runtime/transport.h"

namespace shardlab::train {

LrSchedule parse_lr_schedule(const std::string& text) {
  if (text == "constant") return LrSchedule::kConstant;
  if (text == "cosine") return LrSchedule::kCosine;
  throw ConfigError(fmt::format("`lr_schedule`: unknown schedule \"{}\" (constant, cosine)", text));
}

const char* lr_schedule_name(LrSchedule s) { return s == LrSchedule::kConstant ? "constant" : "cosine"; }

void TrainOptions::validate() const {
  model.validate();
  require(steps >= 1, fmt::format("`steps` must be at least 1 (got {})", steps));
  require(model.batch_size >= 1, fmt::format("`batch_size` must be at least 1 (got {})", model.batch_size));
  require(adam.lr > 0 && std::isfinite(adam.lr), "`lr` must be a positive number");
  require(adam.beta1 >= 0 && adam.beta1 < 1, "`beta1` must be in [0, 1)");
  require(adam.beta2 >= 0 && adam.beta2 < 1, "`beta2` must be in [0, 1)");
  require(adam.eps > 0, "`eps` must be positive");
  require(adam.weight_decay >= 0, "`weight_decay` must be >= 0");
  require(grad_clip >= 0, "`grad_clip` must be >= 0 (0 turns clipping off)");
  require(warmup_steps >= 0, "`warmup_steps` must be >= 0");
  require(schedule_steps == 0 || schedule_steps >= steps, "`steps` must not exceed the schedule's length (TrainOptions::schedule_steps)");
  require(micro_batches >= 1, fmt::format("`micro_batches` must be at least 1 (got {})", micro_batches));
  require(std::isfinite(phantom_zipf) && phantom_zipf >= 0 && phantom_zipf <= 100,
          "`phantom_zipf` S (Zipf routing) needs 0 <= S <= 100");
  require(phantom_zipf == 0 || phantom, "`phantom_zipf` applies to `phantom` runs only");
  if (phantom) {  // nothing is computed: no values to load, save, corrupt or compare
    require(init_path.empty(), "`init_path` cannot be combined with `phantom` (a phantom run has no values)");
    require(save_path.empty(), "`save_path` cannot be combined with `phantom` (a phantom run has no values)");
    require(corrupt_shard.empty() && !keep_step0_grads, "verify cannot run a phantom model");
    require(checkpoint_dir.empty() && resume_dir.empty(),
            "`checkpoint_dir` and `resume_dir` cannot be combined with `phantom` (a phantom run has no values)");
  }
  require(checkpoint_every >= 0, fmt::format("`checkpoint_every` must be at least 1 (got {})", checkpoint_every));
  require(checkpoint_every == 0 || !checkpoint_dir.empty(), "`checkpoint_every` needs `checkpoint_dir`");
  require(resume_dir.empty() || init_path.empty(), "`init_path` and `resume_dir` cannot be combined (the checkpoint has the weights)");
  require(!phantom || data == TrainOptions{}.data,  // an explicit `data` would be silently unused
          fmt::format("`data` {}: a phantom run reads no data (leave `data` out)", data));
  validate_parallel(*this);
  // The result keeps a record per device and step (the report's timelines).
  constexpr int64_t kMaxDeviceSteps = 100'000'000;
  require(int64_t{parallel.world()} * steps <= kMaxDeviceSteps,
          fmt::format("`steps` {} on {} devices: at most {} device-steps (a record is kept for each)", steps,
                      parallel.world(), kMaxDeviceSteps));
}

nlohmann::json TrainOptions::to_json() const {
  return {{"model", engine::model_json(model)},
          {"batch", model.batch_size},
          {"steps", steps},
          {"seed", seed},
          {"optimizer",
           {{"lr", adam.lr}, {"beta1", adam.beta1}, {"beta2", adam.beta2}, {"eps", adam.eps},
            {"weight_decay", adam.weight_decay}, {"grad_clip", grad_clip},
            {"warmup_steps", warmup_steps}, {"lr_schedule", lr_schedule_name(lr_schedule)}}},
          {"data", data},
          {"sampling", model::sampling_name(sampling)},
          {"micro_batches", micro_batches},
          {"init", init_path},
          {"phantom", phantom},
          {"fold", fold},
          {"phantom_routing", phantom_zipf > 0 ? fmt::format("zipf:{}", phantom_zipf) : "uniform"},
          {"arithmetic", model::arithmetic_name(arithmetic)},
          {"save", save_path},
          {"checkpoint", {{"dir", checkpoint_dir}, {"every", checkpoint_every}, {"resume", resume_dir}}},
          {"parallel",
           {{"dp", parallel.dp}, {"tp", parallel.tp}, {"sp", parallel.sp},
            {"tp_comm_overlap", parallel.tp_comm_overlap}, {"overlap_p2p_comm", parallel.overlap_p2p_comm},
            {"overlap_moe_comm", parallel.overlap_moe_comm}, {"delay_wgrad", parallel.delay_wgrad},
            {"zero", parallel.zero}, {"distributed_optimizer", parallel.distributed_optimizer},
            {"reshard_after_forward", parallel.reshard_after_forward}, {"prefetch", parallel.prefetch}, {"hsdp", parallel.hsdp},
            {"overlap_param_gather", parallel.overlap_param_gather}, {"grad_reduce_bf16", parallel.grad_reduce_bf16},
            {"chunk_buckets", parallel.chunk_buckets},
            {"bucket_mb", parallel.bucket_mb}, {"overlap", parallel.overlap},
            {"grad_accum_fusion", parallel.grad_accum_fusion}, {"half_grads", parallel.half_grads},
            {"fusions", model::to_string(parallel.fusions)},
            {"ep", parallel.ep}, {"expert_tp", parallel.experts_whole() ? 1 : parallel.tp}, {"pp", parallel.pp},
            {"cp", parallel.cp}, {"cp_comm", parallel::cp_comm_name(parallel.cp_comm)},
            {"moe_dispatcher", parallel::moe_dispatcher_name(parallel.moe_dispatcher)},
            {"schedule", parallel::schedule_name(parallel.schedule)}, {"vpp", parallel.chunks()},
            {"pp_layers", parallel.stage_layers}, {"recompute", parallel::recompute_name(parallel.recompute)},
            {"recompute_method", parallel.recompute == parallel::Recompute::kFull
                                     ? parallel::recompute_method_name(parallel.recompute_method)
                                     : ""},
            {"recompute_num_layers", parallel.recompute == parallel::Recompute::kFull
                                         ? std::max(1, parallel.recompute_num_layers)
                                         : 0},
            {"recompute_modules", parallel.recompute == parallel::Recompute::kSelective
                                      ? parallel::recompute_modules_name(parallel.recompute_modules)
                                      : std::string()}}}};
}

double learning_rate(const TrainOptions& o, int step) {
  const double lr = o.adam.lr;
  if (step < o.warmup_steps) return lr * (step + 1) / (o.warmup_steps + 1);
  if (o.lr_schedule == LrSchedule::kConstant) return lr;
  const double min_lr = lr / 10;
  const int decay_steps = std::max(1, (o.schedule_steps > 0 ? o.schedule_steps : o.steps) - 1 - o.warmup_steps);
  const double ratio = std::min(1.0, double(step - o.warmup_steps) / decay_steps);
  return min_lr + 0.5 * (1.0 + model::pm::cos_2pi(0.5 * ratio)) * (lr - min_lr);  // cos(π·ratio)
}

namespace {

// nanoGPT's estimate_mfu numerator: 6 N + 12 L H Q T FLOPs per token (MLA:
// 6 L H (Qk + Qv) T), with N
// the parameters without the position table (and, for MoE, only the top-k
// experts' share of the expert parameters: the active parameters).
double flops_per_token(const model::ParamTable& table) {
  const auto& c = table.config();
  double n = 0;
  for (const auto& s : table.specs()) {
    if (s.role == model::ParamRole::kPositionEmbedding) continue;
    n += s.is_expert() ? double(s.numel) * c.top_k / c.n_expert : double(s.numel);
  }
  // Q·Kᵀ over qk_head_size() and P·V over v_head_size() (both head_size() but under MLA).
  return 6 * n + 6.0 * c.n_layer * c.n_head * (c.qk_head_size() + c.v_head_size()) * c.block_size;
}

// Strict loading, as PyTorch's load_state_dict(strict=True), before any
// thread starts: the file holds exactly the model's tensors, each with the
// model's shape. A tensor the model lacks (a checkpoint with more layers,
// experts or another model's parts) is an error naming it, not ignored.
void check_init(const model::SafetensorsFile& f, const model::ParamTable& table) {
  for (const auto& s : table.specs()) f.get(s.name, s.shape);
  engine::check_checkpoint_model(f, table.config(), "`init_path`");  // a shardlab file names the field that differs
  for (const std::string& name : f.names())
    if (!table.find(name))
      throw ConfigError(fmt::format("`init_path` {}: unexpected tensor \"{}\" (not in this model: {}; the file has {} "
                                    "tensors, the model {})",
                                    f.origin(), name, table.config().to_string(), f.size(), table.specs().size()));
}

}  // namespace

namespace {

// The bubble: per step and pipeline, the window from the first stage's start
// to the last stage's end; each rank's idle share of it.
void summarize_phases(const collectives::DeviceMesh& mesh, TrainResult& r) {
  const size_t world = r.phases.size();
  r.phase_totals.assign(world, {});
  double share = 0;
  int64_t count = 0;
  for (size_t rank = 0; rank < world; ++rank) {
    const auto stages = mesh.group_ranks(int(rank), "pp");
    for (size_t step = 0; step < r.phases[rank].size(); ++step) {
      Time start = r.phases[rank][step].start, end = r.phases[rank][step].end;
      for (int other : stages) {
        start = std::min(start, r.phases[size_t(other)][step].start);
        end = std::max(end, r.phases[size_t(other)][step].end);
      }
      const PhaseRecord& mine = r.phases[rank][step];
      const Time idle = std::max<Time>(0, (end - start) - mine.busy);
      DevicePhaseTotals& t = r.phase_totals[rank];
      t.busy += mine.busy;
      t.idle += idle;
      t.p2p_bytes += mine.p2p_bytes;
      if (end > start) {
        share += double(idle) / double(end - start);
        ++count;
      }
    }
  }
  r.bubble_fraction = count > 0 ? share / double(count) : 0.0;
}

// Global tokens per expert per step: the sum over devices of TP rank 0 (TP
// ranks route identically; with whole experts over every device: each
// routes its own rows to experts of its own) of the rows their held experts
// processed.
void summarize_moe(const collectives::DeviceMesh& mesh, const TrainOptions& o, TrainResult& r) {
  const model::GPTConfig& mc = o.model;
  for (size_t rank = 0; rank < r.moe.size(); ++rank) {
    const collectives::Coords c = mesh.coords(int(rank));
    if (c.tp != 0 && !o.parallel.experts_whole()) continue;
    // The experts this rank holds, from its own EP coordinate: a folded
    // rank's record is its representative's, whose experts may be others.
    const size_t begin = size_t(expert_rank(o.parallel, c)) * size_t(mc.n_expert / o.parallel.ep);
    for (const MoeLayerTotals& t : r.moe[rank]) {
      auto it = std::find_if(r.moe_layers.begin(), r.moe_layers.end(),
                             [&](const TrainResult::MoeLayerSteps& m) { return m.layer == t.layer; });
      if (it == r.moe_layers.end()) {
        r.moe_layers.push_back({t.layer, {}, {}});
        it = r.moe_layers.end() - 1;
      }
      it->tokens.resize(t.per_step.size(), std::vector<int64_t>(size_t(mc.n_expert), 0));
      for (size_t step = 0; step < t.per_step.size(); ++step)
        for (size_t e = 0; e < t.per_step[step].size(); ++e) it->tokens[step][begin + e] += t.per_step[step][e];
    }
  }
  std::sort(r.moe_layers.begin(), r.moe_layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  for (auto& m : r.moe_layers) {
    for (const auto& tokens : m.tokens) {
      int64_t total = 0, most = 0;
      for (int64_t x : tokens) total += x, most = std::max(most, x);
      m.imbalance.push_back(total > 0 ? double(most) * double(tokens.size()) / double(total) : 0.0);
    }
  }
}

}  // namespace

namespace {

// The result with every per-device and per-replica record sized for `o`.
TrainResult sized_result(const TrainOptions& o, const model::ParamTable& table, const model::TokenData* data) {
  const model::GPTConfig& mc = o.model;
  const auto world = size_t(o.parallel.world());
  TrainResult r;
  if (data) r.best_loss = data->best_loss;
  r.n_params = table.numel();
  r.tokens_per_step = int64_t{mc.batch_size} * mc.block_size;
  r.model_flops_per_step = flops_per_token(table) * mc.batch_size * mc.block_size;
  r.moe.assign(world, {});
  r.a2a_time.assign(world, 0);
  r.grad_reduce_scatters.assign(world, 0);
  if (o.parallel.zero == 3) r.fsdp.assign(world, {});
  if (o.parallel.overlap_param_gather) r.param_gather.assign(world, {});
  if (o.parallel.cp > 1) r.cp.assign(world, {});
  r.first_step_spans.assign(world, {});
  r.phases.assign(world, std::vector<PhaseRecord>(size_t(o.steps)));
  if (o.phantom) return r;  // no parameter values to gather
  // Sized (and touched) when the devices publish into them, after their
  // activations are freed (publish.cc): not part of the steps' peak memory.
  r.replicas.assign(size_t(o.parallel.data_ranks()), {});
  if (o.keep_step0_grads) r.step0_grads.assign(size_t(table.numel()), 0.0f);
  if (o.parallel.last_stage_rank() != 0 && o.model.tied())
    r.tied_copy.assign(size_t(table.at(model::embedding_name(o.model)).numel), 0.0f);
  if (o.parallel.tp > 1) {  // tp rank 1's layout names the replicated tensors (every tp rank's alike)
    int64_t packed = 0;
    const parallel::ShardLayout tp1(table, mc, o.parallel.tp, 1);
    for (const parallel::ShardSpec& s : tp1.shards())
      if (s.tp_replicated && !s.expert) {
        r.tp_replicated.push_back({table.at(s.name).offset, s.numel});  // whole: local is global
        packed += s.numel;
      }
    std::sort(r.tp_replicated.begin(), r.tp_replicated.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
    r.tp_copies.assign(size_t(o.parallel.tp), std::vector<float>(size_t(packed), 0.0f));
    r.tp_copies[0].clear();  // tp rank 0's are final_params'
  }
  return r;
}

// verify's corruption aid, "NAME:RANK[:REL]": perturbs that rank's shard of
// NAME (verify must be able to fail): by 1e-2·(1+|x|) after the last step, or
// with REL by the factor 1+REL before the first step, a small error that
// training then carries along.
struct Corruption {
  std::function<void(int, parallel::LocalModel&)> before_first_step, before_publish;
};

Corruption corruption(const std::string& spec, int world, const model::ParamTable& table) {
  if (spec.empty()) return {};
  const auto colon = spec.find(':'), second = colon == std::string::npos ? colon : spec.find(':', colon + 1);
  const int target = colon == std::string::npos
                         ? -1
                         : parse_number<int>(std::string_view(spec).substr(colon + 1, second - colon - 1)).value_or(-1);
  if (target < 0 || target >= world)
    throw ConfigError(fmt::format("`corrupt_shard` \"{}\": expected NAME:RANK with RANK below {} (or NAME:RANK:REL)",
                                  spec, world));
  const std::string name = spec.substr(0, colon);
  if (!table.find(name))
    throw ConfigError(fmt::format("`corrupt_shard` \"{}\": the model has no parameter \"{}\"", spec, name));
  double rel = 0;
  if (second != std::string::npos) {
    const std::string text = spec.substr(second + 1);
    rel = parse_number<double>(text).value_or(0);
    if (!(std::abs(rel) > 0 && std::abs(rel) <= 1))
      throw ConfigError(fmt::format("`corrupt_shard` \"{}\": REL \"{}\" must be a number with 0 < |REL| <= 1", spec, text));
  }
  Corruption c;
  (rel == 0 ? c.before_publish : c.before_first_step) = [target, name, rel](int rank, parallel::LocalModel& m) {
    if (rank == target) engine::corrupt_shard(m, name, rel);
  };
  return c;
}

// Notes a difference of two copies: the first place it was seen, and the
// largest one (NaN != NaN counts as a difference, an infinite one).
void note_difference(std::string& first, double& largest, const std::function<std::string()>& where, float a,
                     float b) {
  if (a == b) return;  // bit-identical
  if (first.empty()) first = where();
  largest = std::max(largest, std::isnan(a - b) ? INFINITY : std::abs(double(a) - b));
}

void note_mismatch(TrainResult& r, const std::string& where, float a, float b) {
  note_difference(r.replica_mismatch, r.replica_max_diff, [&] { return where; }, a, b);
}

// Data-parallel replicas (and the cp ranks of each, replica d·cp + c) and the
// last stage's tied copy must equal dp rank 0's parameters bit for bit; the
// first difference is named.
void check_replicas(TrainResult& result, const model::ParamTable& table, int cp) {
  result.final_params = std::move(result.replicas[0]);
  for (size_t r = 1; r < result.replicas.size(); ++r) {
    const std::string where = cp > 1 ? fmt::format(" on dp rank {} cp rank {}", int(r) / cp, int(r) % cp)
                                     : " on dp rank " + std::to_string(r);
    for (const auto& s : table.specs())
      for (int64_t i = 0; i < s.numel; ++i)
        note_mismatch(result, s.name + where, result.replicas[r][size_t(s.offset + i)],
                      result.final_params[size_t(s.offset + i)]);
  }
  result.replicas.clear();
  const std::string wte_name = model::embedding_name(table.config());
  const int64_t wte = table.at(wte_name).offset;
  for (size_t i = 0; i < result.tied_copy.size(); ++i)
    note_mismatch(result, wte_name + ": the last pipeline stage's tied copy", result.tied_copy[i],
                  result.final_params[size_t(wte) + i]);
  // tp ranks 1.. against tp rank 0 (a report: TrainResult::tp_drift).
  const auto name_at = [&](int64_t offset) {  // the specs lie in offset order
    const auto& specs = table.specs();
    const auto after = std::upper_bound(specs.begin(), specs.end(), offset,
                                        [](int64_t o, const model::ParamSpec& s) { return o < s.offset; });
    return std::prev(after)->name;
  };
  for (size_t t = 1; t < result.tp_copies.size(); ++t) {
    const std::vector<float>& copy = result.tp_copies[t];
    size_t at = 0;
    for (const Range& g : result.tp_replicated) {
      for (int64_t i = 0; i < g.size; ++i, ++at)
        note_difference(result.tp_drift, result.tp_drift_max,
                        [&] { return fmt::format("{} on tp rank {}", name_at(g.begin), t); }, copy[at],
                        result.final_params[size_t(g.begin + i)]);
    }
  }
  result.tp_copies.clear();
}

}  // namespace

std::string checkpoint_bytes(const TrainOptions& o, const TrainResult& result) {
  const model::ParamTable table(o.model);
  std::vector<model::NamedTensorView> views;
  for (const auto& s : table.specs()) views.push_back({s.name, s.shape, result.final_params.data() + s.offset});
  nlohmann::json config = o.to_json();
  config.erase("save");  // file names do not belong in the file: identical runs, identical bytes
  config.erase("init");
  config.erase("checkpoint");
  return model::safetensors_bytes(views, {{model::kShardlabConfigKey, config.dump()}});
}

namespace {

// DeepEP's dispatcher relays through the rank at the same place on each
// node: every expert-parallel group must sit on its nodes in equal runs.
void check_moe_dispatcher(const TrainOptions& o, const ParallelPlan& plan, const HardwareProfile& profile) {
  if (o.parallel.moe_dispatcher != parallel::MoeDispatcher::kDeepEp) return;
  for (const std::vector<int>& ep : plan.mesh.all_group_ranks(o.parallel.ep_dims())) {
    const parallel::EpNodes n = parallel::ep_nodes(ep, profile.devices_per_node);
    if (!n.error.empty())
      throw ConfigError(fmt::format("`moe_dispatcher` deepep relays through the rank at the same place on each "
                                    "node, but the expert-parallel group of rank {} ({} devices a node): {}",
                                    ep[0], profile.devices_per_node, n.error));
  }
}

// Runs `attempt` on `cluster` folded by `fold`; when the folding meets ranks
// that are not symmetric (FoldingError), runs it again with a weaker plan,
// which `fold` then holds. The result is exact whichever plan finishes.
template <class Attempt>
RunResult run_folded(Cluster& cluster, const ParallelPlan& plan, engine::FoldPlan& fold, Attempt attempt) {
  while (true) {
    cluster.set_representatives(fold.representative);
    try {
      RunResult r = attempt();
      cluster.set_representatives({});
      return r;
    } catch (const RunError& e) {
      cluster.set_representatives({});
      if (!e.folding() || fold.representative.empty()) throw;
      spdlog::info("folding: {}; running again with less folding", e.what());
      fold = engine::weaker(fold, plan.fold.mesh, cluster.profile());
    }
  }
}

}  // namespace

TrainResult train(Cluster& cluster, const TrainOptions& o, const StepCallback& on_step,
                  const ProgressCallback& on_progress) {
  const ParallelPlan plan(o, cluster.options().precision);  // checks the options first (TrainOptions::validate)
  if (cluster.world_size() != plan.world)
    throw ConfigError(fmt::format("`dp` x `tp` x `pp` x `cp` = {} devices but the cluster has {}", plan.world,
                                  cluster.world_size()));
  check_moe_dispatcher(o, plan, cluster.profile());
  const uint64_t capacity =
      cluster.options().memory_bytes ? cluster.options().memory_bytes : cluster.profile().memory_bytes();
  check_memory(o, plan, capacity, element_size(cluster.options().precision), host_memory_bytes(),
               cluster.options().precision == Precision::kFp8);
  if (!o.save_path.empty()) check_writable(o.save_path, "`save_path`");  // before the run, not after it
  // A phantom run's collectives pass their (empty) messages rather than meet:
  // a meeting saves hand-offs of real data, but each member then replays the
  // whole collective, and over many threads on a few cores that replay costs
  // more than the messages (the NeMo Llama 2 70B row on 64 threads: 27 s of
  // wall time meeting, 4 s passing messages). Same figures either way.
  struct Rendezvous {
    Cluster& c;
    bool was;
    ~Rendezvous() { c.set_rendezvous(was); }
  } const restore{cluster, cluster.options().rendezvous};
  if (o.phantom) cluster.set_rendezvous(false);
  const model::GPTConfig& mc = o.model;
  // A phantom run reads no data: its token buffers are sized and left at 0.
  std::shared_ptr<const model::TokenData> data;
  std::optional<model::BatchSampler> sampler;
  if (!o.phantom) {
    data = std::make_shared<const model::TokenData>(
        model::open_token_data(o.data, mc.token_vocab(), mc.block_size, o.seed));
    sampler.emplace(data, mc.batch_size, mc.block_size, o.sampling, o.seed);
  }
  const model::ParamTable table(mc);
  std::optional<model::SafetensorsFile> init;
  if (!o.init_path.empty()) {
    init = model::load_safetensors(o.init_path);
    check_init(*init, table);
  }
  std::optional<ResumeState> resume;
  if (!o.resume_dir.empty()) resume = load_checkpoint(o, table);
  if (resume) spdlog::info("resuming from {}", resume->describe());
  if (!o.checkpoint_dir.empty()) prepare_checkpoint_dir(o.checkpoint_dir);  // writable before the run
  TrainResult result = sized_result(o, table, data.get());
  const collectives::DeviceMesh& mesh = plan.mesh;
  const Corruption corrupt = corruption(o.corrupt_shard, plan.world, table);
  const DeviceProgram program{o, plan, table, sampler ? &*sampler : nullptr, init ? &*init : nullptr, result, on_step, on_progress,
                              corrupt.before_publish, resume ? &*resume : nullptr, corrupt.before_first_step};
  // Only phantom runs fold; injected faults make ranks differ: every rank runs its own thread.
  engine::FoldPlan fold;
  if (plan.folds && !cluster.options().faults) fold = engine::fold_plan(plan.fold, cluster.profile());
  result.run = run_folded(cluster, plan, fold, [&] {
    result = sized_result(o, table, data.get());  // a retry starts from a clean record
    result.running_devices = fold.representative.empty() ? plan.world : fold.running();
    RunResult run = cluster.run([&](Device& dev) { program.run(dev); });
    if (Transport* t = cluster.transport())  // across processes: every device's part, everywhere
      share_train_result(result, device_owners(cluster.world_size(), t->processes(), cluster.profile()),
                         table.numel());
    return run;
  });
  result.folded = fold.describe();
  if (resume) {
    merge_resumed(*resume, result);
    result.resumed_from = resume->describe();
    result.first_step = resume->step;
  }
  unfold_results(fold, mesh, o, result);
  summarize_phases(mesh, result);
  summarize_moe(mesh, o, result);
  if (!o.phantom) check_replicas(result, table, o.parallel.cp);
  if (!o.save_path.empty() && leader_process()) write_file_atomic(o.save_path, checkpoint_bytes(o, result), "`save_path`");
  return result;
}

}  // namespace shardlab::train
