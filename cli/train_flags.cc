#include "cli/train_flags.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "model/config.h"
#include "model/parallel/sharded_gpt.h"
#include "runtime/errors.h"
#include "runtime/fault.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

std::string preset_list() {
  std::string out;
  for (const std::string& name : model::preset_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

namespace {

// Bounds that keep every size product of the model code within int64 and
// its int dimensions; far beyond any published model (GPT-3: 96 layers,
// embd 12288; Megatron-1T: embd 25600), small enough that a nonsense value
// ("--embd 2000000000") is refused here instead of overflowing later.
constexpr double kMaxDim = 1 << 20;     // --heads, --embd, --seq
constexpr double kMaxCount = 1 << 24;   // --vocab, --ffn, --batch
constexpr double kMaxLayers = 1 << 16;  // --layers, --experts
constexpr double kMaxSteps = 1e6;       // --steps, --warmup-steps (results are kept per step)

}  // namespace

void add_model_flags(CLI::App* sub, TrainFlags& f) {
  sub->add_option("--model", f.model, "Model preset: " + preset_list())->capture_default_str();
  sub->add_option("--layers", f.layers, "Transformer blocks (overrides the preset)")->check(number_in(1, kMaxLayers));
  sub->add_option("--heads", f.heads, "Attention heads")->check(number_in(1, kMaxDim));
  sub->add_option("--embd", f.embd, "Embedding width C")->check(number_in(1, kMaxDim));
  sub->add_option("--vocab", f.vocab, "Vocabulary size (tokens; never padded unless asked)")
      ->check(number_in(2, kMaxCount));
  sub->add_option("--ffn,--ffn-hidden-size", f.ffn, "MLP hidden width (default 4 x --embd)")
      ->check(number_in(1, kMaxCount));
  sub->add_option("--make-vocab-size-divisible-by", f.vocab_divisible_by,
                  "Pad the vocabulary to a multiple of N x --tp, as Megatron (default: 128 for the "
                  "published presets, none for nano/tiny/small and an explicit --vocab)")
      ->check(number_in(1, 1 << 16));
  sub->add_option("--seq", f.seq, "Sequence length = position table size")->check(number_in(1, kMaxDim));
  sub->add_option("--batch", f.batch, "Global batch in sequences")->check(number_in(1, kMaxCount));
  sub->add_option("--experts", f.experts, "MoE experts per MoE block (0 = dense)")
      ->capture_default_str()
      ->check(number_in(0, kMaxLayers));
  sub->add_option("--top-k", f.top_k, "Experts per token")->capture_default_str()->check(number_in(1, kMaxLayers));
  sub->add_option("--moe-every", f.moe_every, "Blocks with layer % N == 0 are MoE")
      ->capture_default_str()
      ->check(number_in(1, kMaxLayers));
  sub->add_option("--aux-coef", f.aux_coef, "Load-balancing loss coefficient (default 0.01 with experts)")
      ->check(number_in(0, 1e6));
  sub->add_option("--capacity-factor", f.capacity_factor, "Expert capacity factor (0 = unlimited)")
      ->capture_default_str()
      ->check(number_in(0, 1e6));
  sub->add_option("--dropout", f.dropout,
                  "Attention and hidden dropout probability: its kernels are charged (phantom runs only)")
      ->capture_default_str()
      ->check(number_in(0, 0.999));
}

namespace {

void add_optimizer_flags(CLI::App* sub, TrainFlags& f) {
  sub->add_option("--steps", f.steps, "Optimizer steps")->capture_default_str()->check(number_in(1, kMaxSteps));
  sub->add_option("--seed", f.seed, "Seed for init and data")->capture_default_str()->check(number_in(0, 1.8e19));
  sub->add_option("--lr", f.lr, "Peak learning rate")->capture_default_str()->check(number_above(0, 1e3));
  sub->add_option("--beta1", f.beta1, "AdamW beta1")->capture_default_str()->check(number_in(0, 1));
  sub->add_option("--beta2", f.beta2, "AdamW beta2")->capture_default_str()->check(number_in(0, 1));
  sub->add_option("--eps", f.eps, "AdamW eps")->capture_default_str()->check(number_above(0, 1));
  sub->add_option("--weight-decay", f.weight_decay, "AdamW decoupled weight decay (2+-dim tensors)")
      ->capture_default_str()
      ->check(number_in(0, 1e3));
  sub->add_option("--grad-clip", f.grad_clip, "Global gradient-norm clip (0 = off)")
      ->capture_default_str()
      ->check(number_in(0, 1e6));
  sub->add_option("--warmup-steps", f.warmup_steps, "Linear warm-up steps")
      ->capture_default_str()
      ->check(number_in(0, kMaxSteps));
  sub->add_option("--lr-schedule", f.lr_schedule, "constant or cosine (to lr/10)")->capture_default_str();
}

void add_io_flags(CLI::App* sub, TrainFlags& f) {
  sub->add_option("--data", f.data, "synthetic:NAME or FILE.bin")->capture_default_str()->check(nonempty());
  sub->add_option("--sampling", f.sampling, "random or sequential")->capture_default_str();
  sub->add_option("--init", f.init, "Start from FILE.safetensors (strict: exactly the model's tensors)")
      ->check(nonempty());
  sub->add_option("--save", f.save, "Save FILE.safetensors after training")->check(nonempty());
  sub->add_option("--report", f.report, "Write the run report to FILE.json")->check(nonempty());
  sub->add_option("--memory", f.memory, "Per-device memory, e.g. 64MiB (default: the profile's)")->check(nonempty());
  sub->add_option("--precision", f.precision, "Modeled precision: fp32 or bf16")->capture_default_str();
}

void add_parallel_flags(CLI::App* sub, TrainFlags& f) {
  auto degree = [&](const char* name, int& field, const char* help) {
    sub->add_option(name, field, help)->capture_default_str()->check(number_in(1, double(kMaxDevices)));
  };
  degree("--dp", f.dp, "Data-parallel degree");
  degree("--tp", f.tp, "Tensor-parallel degree (Megatron)");
  sub->add_flag("--sp", f.sp, "Sequence parallelism (with --tp)");
  sub->add_flag("--scatter-gather", f.scatter_gather,
                "Without --sp: each TP rank sends 1/tp of the activations between stages, an all-gather "
                "over the TP group reassembles them (Megatron-LM 2021)");
  sub->add_option("--zero", f.zero,
                  "ZeRO stage over dp: 0, 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters: FSDP units)")
      ->capture_default_str();
  sub->add_flag("--reshard-after-forward,!--no-reshard-after-forward", f.reshard_after_forward,
                "ZeRO-3: free each unit after its forward and gather it again for backward (default; off keeps "
                "it until backward)");
  sub->add_option("--hsdp", f.hsdp,
                  "ZeRO-3 hybrid sharding: shard over groups of N consecutive dp ranks, replicate across them "
                  "(gradients all-reduced over the replicas)")
      ->check(number_in(1, double(kMaxDevices)));
  sub->add_flag("--prefetch,!--no-prefetch", f.prefetch,
                "ZeRO-3: gather the next unit on the communication stream while this one computes (default)");
  sub->add_option("--bucket-mb", f.bucket_mb, "DP gradient bucket size in MB")
      ->capture_default_str()
      ->check(number_above(0, 1e6));
  sub->add_flag("--no-overlap", f.no_overlap, "Reduce DP gradients after backward instead of during it");
  degree("--ep", f.ep, "Expert-parallel degree (divides --dp; --experts / ep experts per GPU)");
  degree("--pp", f.pp, "Pipeline-parallel stages");
  degree("--cp", f.cp, "Context-parallel degree: every sequence split over N ranks (2N chunks, causal load balancing)");
  sub->add_option("--cp-comm", f.cp_comm, "Context parallelism's K/V exchange: ring (point to point) or allgather")
      ->capture_default_str();
  degree("--micro-batches", f.micro_batches, "Micro-batches per step (gradient accumulation; the pipeline's M)");
  sub->add_option("--schedule", f.schedule,
                  "Pipeline schedule: gpipe, 1f1b, interleaved, or zero-bubble zb-h1, zb-h2, zb-v, dualpipev")
      ->capture_default_str();
  sub->add_option("--vpp", f.vpp,
                  "Model chunks per pipeline rank (interleaved: 2 or more; zb-v and dualpipev: 2, the default)")
      ->check(number_in(1, double(kMaxDevices)));
  sub->add_option("--pp-layers", f.pp_layers, "Blocks per stage, e.g. 3,3,2 (default: balanced)")->check(nonempty());
  sub->add_option("--recompute", f.recompute,
                  "Activation recomputation: none, selective (attention core) or full (whole blocks)")
      ->capture_default_str();
}

}  // namespace

void TrainFlags::add(CLI::App* sub) {
  add_common_flags(sub, common);
  add_model_flags(sub, *this);
  add_optimizer_flags(sub, *this);
  add_io_flags(sub, *this);
  add_parallel_flags(sub, *this);
  sub->add_flag("--phantom", phantom,
                "Shapes only: run every kernel, collective and allocation on the clock, compute nothing");
  sub->add_option("--phantom-routing", phantom_routing,
                  "Phantom MoE routing assumption: uniform or zipf:S (expert e gets ~1/(e+1)^S)")
      ->capture_default_str();
  sub->add_option("--arithmetic", arithmetic,
                  "native: the host's fastest GEMM (bits reproducible on this machine); portable: the same "
                  "bits on every machine and build, slower")
      ->capture_default_str();
  sub->add_flag("--no-fold", no_fold,
                "Phantom runs: give every device its own thread (no folding of symmetric ranks)");
  sub->add_option("--corrupt-shard", corrupt_shard, "NAME:RANK (testing verify)")->group("");
  sub->add_option("--fault", faults,
                  "Inject a fault (repeatable), or @FILE.json with a list of them: slow-link:A-B:bw=F[,lat_us=+X]"
                  "[,from_step=S], slow-nic:D:..., link-down:A-B:step=S, straggler:D:compute=F[,from_step=S], "
                  "dead:D:step=S, memory:D:capacity=SIZE|FRACTION (README \"Fault injection\")")
      ->check(nonempty())
      ->take_all();
}

void TrainFlags::add_checkpoint_flags(CLI::App* sub) {
  sub->add_option("--checkpoint-dir", checkpoint_dir,
                  "Write sharded checkpoints into DIR (DIR/step-NNNNNN/, DIR/latest) every --checkpoint-every "
                  "steps and after the last step")
      ->check(nonempty());
  sub->add_option("--checkpoint-every", checkpoint_every, "Steps between checkpoints (with --checkpoint-dir)");
  sub->add_option("--resume", resume,
                  "Continue from DIR's latest checkpoint (--steps stays the total; any parallel config: reshards)")
      ->check(nonempty());
}

model::GPTConfig TrainFlags::model_config() const {
  const model::PresetInfo& info = model::preset_info(model);
  model::GPTConfig c = info.config;
  auto set = [](int& field, int value) {
    if (value != 0) field = value;
  };
  set(c.n_layer, layers);
  set(c.n_head, heads);
  set(c.n_embd, embd);
  set(c.vocab_size, vocab);
  set(c.block_size, seq);
  set(c.batch_size, batch);
  for (auto [flag, v] : {std::pair{"--layers", layers}, std::pair{"--heads", heads}, std::pair{"--embd", embd},
                         std::pair{"--vocab", vocab}, std::pair{"--seq", seq}, std::pair{"--batch", batch}}) {
    if (v < 0) throw ConfigError(fmt::format("{} must be positive (got {})", flag, v));
  }
  if (ffn && *ffn <= 0)
    throw ConfigError(fmt::format("--ffn must be positive (got {}; leave it out for 4 x --embd)", *ffn));
  c.n_ffn = ffn.value_or(0);
  c.n_expert = experts;
  c.top_k = top_k;
  c.moe_every = moe_every;
  c.aux_coef = aux_coef >= 0 ? aux_coef : (experts > 0 ? 0.01 : 0.0);
  c.capacity_factor = capacity_factor;
  c.dropout = dropout;
  if (vocab_divisible_by && *vocab_divisible_by < 1)
    throw ConfigError(fmt::format("--make-vocab-size-divisible-by must be at least 1 (got {})", *vocab_divisible_by));
  const int multiple = vocab_divisible_by.value_or(info.pads_vocab && vocab == 0 ? 128 : 0);
  if (multiple > 0 && tp >= 1 && c.vocab_size >= 2) c = model::with_padded_vocab(c, multiple, tp);
  return c;
}

namespace {

// "uniform" -> 0, "zipf:S" -> S; anything else is one error line.
double parse_phantom_routing(const std::string& text) {
  if (text == "uniform") return 0;
  if (text.rfind("zipf:", 0) == 0) {
    try {
      size_t used = 0;
      const double s = std::stod(text.substr(5), &used);
      if (used == text.size() - 5 && std::isfinite(s) && s > 0 && s <= 100) return s;
    } catch (const std::exception&) {
    }
  }
  throw ConfigError(fmt::format("--phantom-routing: \"{}\" is not uniform or zipf:S with 0 < S <= 100", text));
}

}  // namespace

train::TrainOptions TrainFlags::options() const {
  // Each degree is at most kMaxDevices (2^20): the product of two fits an
  // int64, of four only a double.
  const double devices = double(dp) * tp * pp * cp;
  const int64_t world = devices > double(kMaxDevices) ? kMaxDevices + 1 : int64_t{dp} * tp * pp * cp;
  if (world > kMaxDevices)
    throw ConfigError(fmt::format("--dp {} x --tp {} x --pp {} x --cp {} = {} devices: at most {}", dp, tp, pp, cp, devices,
                                  kMaxDevices));
  // The result keeps a record per device and step (the report's timelines).
  constexpr int64_t kMaxDeviceSteps = 100'000'000;
  if (world * steps > kMaxDeviceSteps)
    throw ConfigError(fmt::format("--steps {} on {} devices: at most {} device-steps (a record is kept for each)",
                                  steps, world, kMaxDeviceSteps));
  train::TrainOptions o;
  o.model = model_config();
  o.steps = steps;
  o.seed = seed;
  o.adam = {lr, beta1, beta2, eps, weight_decay};
  o.grad_clip = grad_clip;
  o.warmup_steps = warmup_steps;
  o.lr_schedule = train::parse_lr_schedule(lr_schedule);
  o.data = data;
  o.sampling = model::parse_sampling(sampling);
  o.init_path = init;
  o.save_path = save;
  o.parallel.dp = dp;
  o.parallel.tp = tp;
  o.parallel.sp = sp;
  o.parallel.scatter_gather = scatter_gather;
  o.parallel.zero = zero;
  o.parallel.bucket_mb = bucket_mb;
  o.parallel.overlap = !no_overlap;
  o.parallel.reshard_after_forward = reshard_after_forward;
  o.parallel.prefetch = prefetch;
  o.parallel.hsdp = hsdp;
  o.parallel.ep = ep;
  o.parallel.pp = pp;
  o.parallel.cp = cp;
  o.parallel.cp_comm = parallel::parse_cp_comm(cp_comm);
  o.parallel.schedule = parallel::parse_schedule(schedule);
  o.parallel.vpp = vpp.value_or(0);  // 0: the schedule's own (ParallelOptions::chunks)
  o.parallel.recompute = parallel::parse_recompute(recompute);
  if (!pp_layers.empty()) o.parallel.stage_layers = parallel::parse_stage_layers(pp_layers);
  o.micro_batches = micro_batches;
  o.corrupt_shard = corrupt_shard;
  if (checkpoint_every && *checkpoint_every < 1)
    throw ConfigError(fmt::format("--checkpoint-every must be at least 1 (got {})", *checkpoint_every));
  o.checkpoint_dir = checkpoint_dir;
  o.checkpoint_every = checkpoint_every.value_or(0);
  if (checkpoint_every && checkpoint_dir.empty()) throw ConfigError("--checkpoint-every needs --checkpoint-dir");
  o.resume_dir = resume;
  o.phantom = phantom;
  o.fold = !no_fold;
  o.phantom_zipf = parse_phantom_routing(phantom_routing);
  const auto chosen = model::parse_arithmetic(arithmetic);
  if (!chosen) throw ConfigError(fmt::format("--arithmetic: \"{}\" is not native or portable", arithmetic));
  o.arithmetic = *chosen;
  if (phantom && data != train::TrainOptions{}.data)  // an explicit --data would be silently unused
    throw ConfigError(fmt::format("--data {}: a phantom run reads no data (leave --data out)", data));
  o.validate();
  train::validate_parallel(o);
  return o;
}

ClusterOptions TrainFlags::cluster_options() const {
  ClusterOptions c;
  if (!memory.empty()) {
    c.memory_bytes = parse_bytes(memory, "--memory");
    // 0 would mean "the profile's" to the cluster: an explicit 0 is refused, not replaced.
    if (c.memory_bytes == 0) throw ConfigError("--memory 0: a device needs some memory (e.g. 64MiB)");
  }
  if (precision == "fp32") c.precision = Precision::kFp32;
  else if (precision == "bf16") c.precision = Precision::kBf16;
  else throw ConfigError(fmt::format("--precision: unknown \"{}\" (fp32, bf16)", precision));
  c.pace = common.pace;
  c.world_size = dp * tp * pp * cp;
  c.trace = !common.trace.empty();
  if (!faults.empty()) c.faults = std::make_shared<const FaultPlan>(parse_faults(faults), c.world_size, steps);
  return c;
}

}  // namespace shardlab::cli
