#include "model/train/trainer.h"

#include <chrono>
#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/gpt.h"
#include "model/io/safetensors.h"
#include "model/params.h"
#include "model/train/device_sink.h"
#include "runtime/errors.h"

namespace shardlab::train {

LrSchedule parse_lr_schedule(const std::string& text) {
  if (text == "constant") return LrSchedule::kConstant;
  if (text == "cosine") return LrSchedule::kCosine;
  throw ConfigError(fmt::format("--lr-schedule: unknown schedule \"{}\" (constant, cosine)", text));
}

const char* lr_schedule_name(LrSchedule s) { return s == LrSchedule::kConstant ? "constant" : "cosine"; }

void TrainOptions::validate() const {
  model.validate();
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw ConfigError(what);
  };
  require(steps >= 1, fmt::format("--steps must be at least 1 (got {})", steps));
  require(model.batch_size >= 1, fmt::format("--batch must be at least 1 (got {})", model.batch_size));
  require(adam.lr > 0 && std::isfinite(adam.lr), "--lr must be a positive number");
  require(adam.beta1 >= 0 && adam.beta1 < 1, "--beta1 must be in [0, 1)");
  require(adam.beta2 >= 0 && adam.beta2 < 1, "--beta2 must be in [0, 1)");
  require(adam.eps > 0, "--eps must be positive");
  require(adam.weight_decay >= 0, "--weight-decay must be >= 0");
  require(grad_clip >= 0, "--grad-clip must be >= 0 (0 turns clipping off)");
  require(warmup_steps >= 0, "--warmup-steps must be >= 0");
}

nlohmann::json TrainOptions::to_json() const {
  return {{"model",
           {{"layers", model.n_layer}, {"heads", model.n_head}, {"embd", model.n_embd},
            {"seq", model.block_size}, {"vocab", model.vocab_size}, {"experts", model.n_expert},
            {"top_k", model.top_k}, {"moe_every", model.moe_every}, {"aux_coef", model.aux_coef},
            {"capacity_factor", model.capacity_factor}}},
          {"batch", model.batch_size},
          {"steps", steps},
          {"seed", seed},
          {"optimizer",
           {{"lr", adam.lr}, {"beta1", adam.beta1}, {"beta2", adam.beta2}, {"eps", adam.eps},
            {"weight_decay", adam.weight_decay}, {"grad_clip", grad_clip},
            {"warmup_steps", warmup_steps}, {"lr_schedule", lr_schedule_name(lr_schedule)}}},
          {"data", data},
          {"sampling", model::sampling_name(sampling)},
          {"init", init_path},
          {"save", save_path}};
}

double learning_rate(const TrainOptions& o, int step) {
  const double lr = o.adam.lr;
  if (step < o.warmup_steps) return lr * (step + 1) / (o.warmup_steps + 1);
  if (o.lr_schedule == LrSchedule::kConstant) return lr;
  const double min_lr = lr / 10;
  const int decay_steps = std::max(1, o.steps - 1 - o.warmup_steps);
  const double ratio = std::min(1.0, double(step - o.warmup_steps) / decay_steps);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

namespace {

// nanoGPT's estimate_mfu numerator: 6 N + 12 L H Q T FLOPs per token, with N
// the parameters without the position table (and, for MoE, only the top-k
// experts' share of the expert parameters: the active parameters).
double flops_per_token(const model::ParamTable& table) {
  const auto& c = table.config();
  double n = 0;
  for (const auto& s : table.specs()) {
    if (s.name == "transformer.wpe.weight") continue;
    const bool expert = s.name.find(".mlp.experts.") != std::string::npos;
    n += expert ? double(s.numel) * c.top_k / c.n_expert : double(s.numel);
  }
  return 6 * n + 12.0 * c.n_layer * c.n_head * c.head_size() * c.block_size;
}

// Checks every tensor of the model against the file before any thread starts.
void check_init(const model::SafetensorsFile& f, const model::ParamTable& table) {
  for (const auto& s : table.specs()) f.get(s.name, s.shape);
}

}  // namespace

TrainResult train(Cluster& cluster, const TrainOptions& o, const StepCallback& on_step) {
  o.validate();
  if (cluster.world_size() != 1)
    throw ConfigError(fmt::format("training runs on 1 device so far (cluster has {})", cluster.world_size()));
  const model::GPTConfig& mc = o.model;
  const int B = mc.batch_size, T = mc.block_size;
  auto data = std::make_shared<const model::TokenData>(
      model::open_token_data(o.data, mc.vocab_size, T, o.seed));
  const model::BatchSampler sampler(data, B, T, o.sampling, o.seed);
  const model::ParamTable table(mc);
  std::optional<model::SafetensorsFile> init;
  if (!o.init_path.empty()) {
    init = model::load_safetensors(o.init_path);
    check_init(*init, table);
  }

  TrainResult result;
  result.best_loss = data->best_loss;
  result.n_params = table.numel();
  result.tokens_per_step = int64_t{B} * T;
  result.model_flops_per_step = flops_per_token(table) * B * T;
  std::vector<float> final_params;

  result.run = cluster.run([&](Device& dev) {
    DeviceSink sink(dev);
    model::GPT<float> gpt(mc, o.seed);
    gpt.set_sink(&sink);
    if (init) {
      for (const auto& s : table.specs()) {
        auto src = init->get(s.name, s.shape);
        std::copy(src.begin(), src.end(), gpt.param(s.name).begin());
      }
    }
    const int64_t n = table.numel();
    // Modeled memory: weights and gradients at the modeled precision; AdamW
    // moments in fp32, plus fp32 master weights when the model is bf16
    // (16 bytes per parameter either way, as in the ZeRO paper).
    const bool bf16 = dev.precision() == Precision::kBf16;
    Tensor weights = dev.alloc("parameters", {n}, MemKind::kParam, /*phantom=*/true);
    Tensor grads = dev.alloc("gradients", {n}, MemKind::kGrad, /*phantom=*/true);
    dev.arena().allocate(uint64_t(n) * (bf16 ? 12 : 8), MemKind::kOptimizer, "adamw state");
    model::Buffer<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);
    const int elem = element_size(dev.precision());
    const auto wall0 = std::chrono::steady_clock::now();

    for (int step = 0; step < o.steps; ++step) {
      model::Batch batch = sampler.next_batch(step);
      gpt.zero_grad();
      const float loss = gpt.forward(batch.x.data(), batch.y.data(), B, T);
      gpt.backward();
      StepRecord rec;
      rec.step = step;
      rec.loss = loss;
      rec.ce = gpt.ce_loss();
      rec.aux = gpt.aux_loss();
      rec.lr = learning_rate(o, step);
      auto g = gpt.grads();
      rec.grad_norm = std::sqrt(model::sum_squares(g.data(), n));
      sink.op("grad_norm", model::sum_squares_cost(n, elem));
      if (o.grad_clip > 0) {
        const double coef = o.grad_clip / (rec.grad_norm + 1e-6);  // torch clip_grad_norm_
        if (coef < 1) {
          model::scale_inplace(g.data(), static_cast<float>(coef), n);
          sink.op("grad_clip", model::scale_inplace_cost(n, elem));
        }
      }
      model::AdamWHyper h = o.adam;
      h.lr = rec.lr;
      auto p = gpt.params();
      for (const auto& s : table.specs()) {
        model::adamw_update(p.data() + s.offset, m.data() + s.offset, v.data() + s.offset,
                            g.data() + s.offset, s.numel, h, s.decay() ? h.weight_decay : 0.0,
                            step + 1);
      }
      sink.op("adamw", model::adamw_update_cost(n, elem));
      rec.virtual_end = dev.now();
      rec.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      result.steps.push_back(rec);
      if (on_step) on_step(rec);
    }
    result.loop_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    final_params.assign(gpt.params().begin(), gpt.params().end());
    dev.arena().release(uint64_t(n) * (bf16 ? 12 : 8), MemKind::kOptimizer);
  });

  if (!o.save_path.empty()) {
    std::vector<model::NamedTensorView> views;
    for (const auto& s : table.specs()) views.push_back({s.name, s.shape, final_params.data() + s.offset});
    nlohmann::json config = o.to_json();
    config.erase("save");  // file names do not belong in the file: identical runs, identical bytes
    config.erase("init");
    model::save_safetensors(o.save_path, views, {{model::kShardlabConfigKey, config.dump()}});
  }
  return result;
}

nlohmann::json report_json(const TrainOptions& o, const Cluster& cluster, const TrainResult& r) {
  nlohmann::json j;
  j["config"] = o.to_json();
  j["config"]["profile"] = cluster.profile().name;
  j["config"]["devices"] = cluster.world_size();
  j["config"]["precision"] = precision_name(cluster.options().precision);
  j["steps"] = nlohmann::json::array();
  for (const auto& s : r.steps) {
    j["steps"].push_back({{"step", s.step}, {"loss", s.loss}, {"ce_loss", s.ce}, {"aux_loss", s.aux},
                          {"lr", s.lr}, {"grad_norm", s.grad_norm},
                          {"virtual_time_s", to_seconds(s.virtual_end)}, {"wall_s", s.wall_s}});
  }
  const Time makespan = r.run.makespan();
  j["devices"] = nlohmann::json::array();
  for (const auto& d : r.run.devices) {
    nlohmann::json peaks;
    for (int k = 0; k < kNumMemKinds; ++k) peaks[mem_kind_name(static_cast<MemKind>(k))] = d.peak_by_kind[k];
    const Time idle = std::max<Time>(0, makespan - d.compute_busy - d.comm_busy);
    j["devices"].push_back({{"rank", d.rank}, {"node", d.node},
                            {"coords", {{"dp", 0}, {"tp", 0}, {"pp", 0}, {"ep", 0}}},
                            {"peak_bytes", d.peak_bytes}, {"peak_bytes_by_kind", peaks},
                            {"capacity_bytes", d.capacity_bytes},
                            {"compute_s", to_seconds(d.compute_busy)}, {"comm_s", to_seconds(d.comm_busy)},
                            {"idle_s", to_seconds(idle)}});
  }
  const double step_s = to_seconds(makespan) / std::max<size_t>(1, r.steps.size());
  const double peak = CostModel(cluster.profile().device, cluster.options().precision).peak_flops();
  j["summary"] = {
      {"virtual_step_s", step_s},
      {"virtual_total_s", to_seconds(makespan)},
      {"host_tokens_per_s", r.loop_wall_s > 0 ? double(r.tokens_per_step) * r.steps.size() / r.loop_wall_s : 0},
      {"bubble_fraction", 0.0},
      {"mfu", step_s > 0 ? r.model_flops_per_step / step_s / (peak * cluster.world_size()) : 0},
      {"final_loss", r.steps.empty() ? 0 : r.steps.back().loss},
      {"n_params", r.n_params}};
  if (r.best_loss) j["summary"]["best_loss"] = *r.best_loss;
  return j;
}

}  // namespace shardlab::train
