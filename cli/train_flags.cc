#include "cli/train_flags.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "cli/flag_table.h"
#include "model/config.h"
#include "model/fusions.h"
#include "model/parallel/attention_kernel.h"
#include "model/parallel/sharded_gpt.h"
#include "runtime/errors.h"
#include "runtime/fault.h"
#include "runtime/parse_number.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

std::string preset_list() {
  std::string out;
  for (const std::string& name : model::preset_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Bounds that keep every size product of the model code within int64 and
// its int dimensions; far beyond any published model (GPT-3: 96 layers,
// embd 12288; Megatron-1T: embd 25600), small enough that a nonsense value
// ("--embd 2000000000") is refused here instead of overflowing later.
constexpr double kMaxDim = 1 << 20;     // --heads, --embd, --seq
constexpr double kMaxCount = 1 << 24;   // --vocab, --ffn, --batch
constexpr double kMaxLayers = 1 << 16;  // --layers, --experts
constexpr double kMaxSteps = 1e6;       // --steps, --warmup-steps (results are kept per step)

#define FIELD(path) FLAG_FIELD(TrainFlags, path)

}  // namespace

FlagTable<TrainFlags> model_flags() {
  return {
      {"--model", FIELD(model), "Model preset: " + preset_list(), {}, kShowDefault},
      {"--layers", FIELD(layers), "Transformer blocks (overrides the preset)", number_in(1, kMaxLayers)},
      {"--heads", FIELD(heads), "Attention heads", number_in(1, kMaxDim)},
      {"--embd", FIELD(embd), "Embedding width C", number_in(1, kMaxDim)},
      {"--vocab", FIELD(vocab), "Vocabulary size (tokens; never padded unless asked)", number_in(2, kMaxCount)},
      {"--ffn,--ffn-hidden-size", FIELD(ffn), "MLP hidden width (default 4 x --embd)", number_in(1, kMaxCount)},
      {"--make-vocab-size-divisible-by", FIELD(vocab_divisible_by),
       "Pad the vocabulary to a multiple of N x --tp, as Megatron (default: 128 for the published presets, none "
       "for nano/tiny/small and an explicit --vocab)",
       number_in(1, 1 << 16)},
      {"--seq", FIELD(seq), "Sequence length = position table size", number_in(1, kMaxDim)},
      {"--batch", FIELD(batch), "Global batch in sequences", number_in(1, kMaxCount)},
      // The MoE shape flags default to the preset's (tiny-moe, mixtral-8x7b, deepseek-v3; else dense).
      {"--experts", FIELD(experts), "MoE experts per MoE block (0 = dense; default: the preset's)",
       number_in(0, kMaxLayers)},
      {"--moe-top-k,--top-k", FIELD(top_k), "MoE experts per token (--top-k: train's alias; default: the preset's, 2)",
       number_in(1, kMaxLayers)},
      {"--moe-every", FIELD(moe_every), "Blocks with layer % N == 0 are MoE (default: the preset's, 1)",
       number_in(1, kMaxLayers)},
      {"--aux-coef", FIELD(aux_coef), "Load-balancing loss coefficient (default: the preset's, 0.01 with experts; deepseek-v3: 0, aux-loss-free)",
       number_in(0, 1e6)},
      {"--capacity-factor", FIELD(capacity_factor), "Expert capacity factor (0 = unlimited)", number_in(0, 1e6),
       kShowDefault},
      // Modern MoE (README "Mixture of Experts"): DeepSeek-V3 / Mixtral routing.
      {"--moe-ffn", FIELD(moe_ffn),
       "Each routed expert's MLP width (fine-grained experts; 0 = the --ffn width; default: the preset's)",
       number_in(0, kMaxCount)},
      {"--shared-experts", FIELD(shared_experts),
       "Shared experts every token goes through, added to the routed output (width N x the expert width; "
       "default: the preset's)",
       number_in(0, kMaxLayers)},
      {"--moe-router,--router", FIELD(router),
       "MoE router scores: softmax (over the experts) or sigmoid (DeepSeek-V3) (--router: train's alias; default: "
       "the preset's, softmax)"},
      {"--moe-norm-topk,!--no-moe-norm-topk", FIELD(moe_norm_topk),
       "Normalize the top-k gates to sum 1 (default; Mixtral's softmax over the top-k)"},
      {"--moe-first-dense", FIELD(moe_first_dense),
       "The first N blocks are dense MLPs of the --ffn width (DeepSeek-V3: 3; default: the preset's)",
       number_in(0, kMaxLayers)},
      {"--moe-groups", FIELD(moe_groups),
       "Group-limited routing: the experts in N groups of consecutive experts, each token's top-k from the "
       "--moe-group-top-k best groups (DeepSeek-V3's node-limited routing: 8; Megatron's --moe-router-num-groups; "
       "default: the preset's, 1 = no limit)",
       number_in(1, kMaxCount)},
      {"--moe-group-top-k", FIELD(moe_group_top_k),
       "Groups each token may route to (DeepSeek-V3: 4; Megatron's --moe-router-group-topk; a group's key is the sum "
       "of its top-k / N best scores; default: the preset's, 1)",
       number_in(1, kMaxCount)},
      {"--router-bias-rate", FIELD(router_bias_rate),
       "Aux-loss-free balancing (DeepSeek-V3): a per-expert bias on the scores for the top-k choice only, "
       "b += rate * sign(mean load - load) after each step (0 = off; default: the preset's, deepseek-v3 0.001; saved as mlp.gate.e_score_correction_bias)",
       number_in(0, 1)},
      {"--family", FIELD(family),
       "Architecture: gpt (LayerNorm, GELU, learned positions, biases, tied head) or llama (RMSNorm, SwiGLU, "
       "rotary, GQA, no biases, untied head); default: the preset's",
       CLI::IsMember({"gpt", "llama"})},
      {"--kv-heads", FIELD(kv_heads), "K/V heads (grouped-query attention; 1 = MQA; default: --heads)",
       number_in(1, kMaxDim)},
      {"--head-dim", FIELD(head_dim),
       "Attention head size (Megatron's --kv-channels, Hugging Face's head_dim; llama family): q_proj is "
       "(heads x head-dim, embd), o_proj its transpose (default: the preset's, --embd / --heads)",
       number_in(2, kMaxDim)},
      {"--qk-norm", FIELD(qk_norm),
       "QK-norm (Qwen3; llama family): an RMSNorm over each head of q and of k after their projections, "
       "before RoPE (self_attn.q_norm, k_norm; default: the preset's)"},
      {"--kv-lora-rank", FIELD(kv_lora_rank),
       "Multi-head latent attention (DeepSeek-V2/V3; llama family): the rank of the k/v latent "
       "(kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; deepseek-v3: 512); 0 = MHA/GQA (default: the preset's)",
       number_in(0, kMaxDim)},
      {"--q-lora-rank", FIELD(q_lora_rank),
       "MLA: the rank of q's latent (q_a_proj, q_a_layernorm, q_b_proj; deepseek-v3: 1536); 0 = q_proj from the "
       "hidden state (default: the preset's)",
       number_in(0, kMaxDim)},
      {"--qk-rope-head-dim", FIELD(qk_rope_head_dim),
       "MLA: each head's rotated query/key features, the key's shared by the heads (deepseek-v3: 64); "
       "--head-dim gives the unrotated ones (128) (default: the preset's)",
       number_in(0, kMaxDim)},
      {"--v-head-dim", FIELD(v_head_dim),
       "MLA: each head's value features (deepseek-v3: 128; 0 = --head-dim; default: the preset's)",
       number_in(0, kMaxDim)},
      {"--rope-theta", FIELD(rope_theta), "Rotary base theta (llama family; default: the preset's, 10000)",
       number_in(1.0001, 1e12)},
      {"--norm-eps", FIELD(norm_eps), "LayerNorm / RMSNorm epsilon (default 1e-5)", number_in(1e-12, 0.5)},
      {"--tie-embeddings", FIELD(tie_embeddings), "LM head tied to the token embedding (gpt's default)"},
      {"--no-tie-embeddings", FIELD(no_tie_embeddings), "Separate lm_head.weight (llama's default)"},
      {"--dropout", FIELD(dropout),
       "Attention and hidden dropout probability: its kernels are charged (phantom runs only)", number_in(0, 0.999),
       kShowDefault},
  };
}

namespace {

FlagTable<TrainFlags> optimizer_flags() {
  return {
      {"--steps", FIELD(opts.steps), "Optimizer steps", number_in(1, kMaxSteps), kShowDefault},
      {"--seed", FIELD(opts.seed), "Seed for init and data", number_in(0, 1.8e19), kShowDefault},
      {"--lr", FIELD(opts.adam.lr), "Peak learning rate", number_above(0, 1e3), kShowDefault},
      {"--beta1", FIELD(opts.adam.beta1), "AdamW beta1", number_in(0, 1), kShowDefault},
      {"--beta2", FIELD(opts.adam.beta2), "AdamW beta2", number_in(0, 1), kShowDefault},
      {"--eps", FIELD(opts.adam.eps), "AdamW eps", number_above(0, 1), kShowDefault},
      {"--weight-decay", FIELD(opts.adam.weight_decay), "AdamW decoupled weight decay (2+-dim tensors)",
       number_in(0, 1e3), kShowDefault},
      {"--grad-clip", FIELD(opts.grad_clip), "Global gradient-norm clip (0 = off)", number_in(0, 1e6), kShowDefault},
      {"--warmup-steps", FIELD(opts.warmup_steps), "Linear warm-up steps", number_in(0, kMaxSteps), kShowDefault},
      {"--lr-schedule", FIELD(lr_schedule), "constant or cosine (to lr/10)", {}, kShowDefault},
  };
}

FlagTable<TrainFlags> io_flags() {
  return {
      {"--data", FIELD(opts.data), "synthetic:NAME or FILE.bin", nonempty(), kShowDefault},
      {"--sampling", FIELD(sampling), "random or sequential", {}, kShowDefault},
      {"--init", FIELD(opts.init_path), "Start from FILE.safetensors (strict: exactly the model's tensors)",
       nonempty()},
      {"--save", FIELD(opts.save_path), "Save FILE.safetensors after training", nonempty()},
      {"--report", FIELD(report), "Write the run report to FILE.json", nonempty()},
      {"--memory", FIELD(memory), "Per-device memory, e.g. 64MiB (default: the profile's)", nonempty()},
      {"--precision", FIELD(precision), "Modeled precision: fp32, bf16, or fp8 (Transformer Engine: FP8 linears, BF16 elsewhere)", {}, kShowDefault},
  };
}

FlagTable<TrainFlags> parallel_flags() {
  const CLI::Validator degree = number_in(1, double(kMaxDevices));
  return {
      {"--dp", FIELD(opts.parallel.dp), "Data-parallel degree", degree, kShowDefault},
      {"--tp", FIELD(opts.parallel.tp), "Tensor-parallel degree (Megatron)", degree, kShowDefault},
      {"--sp", FIELD(opts.parallel.sp), "Sequence parallelism (with --tp)"},
      {"--overlap-moe-expert-parallel-comm", FIELD(opts.parallel.overlap_moe_comm),
       "Megatron's combined 1F1B (without --pp, or with --schedule interleaved): a forward and another "
       "micro-batch's backward run as one step, interleaved at every MoE token exchange, the exchanges on a "
       "communication stream of their own, so each hides under the other micro-batch's compute"},
      {"--delay-wgrad-compute", FIELD(opts.parallel.delay_wgrad),
       "With --overlap-moe-expert-parallel-comm: the experts' weight gradients run after the backward's dispatch "
       "exchange is posted, beside it (Megatron's delay_wgrad_compute)"},
      {"--tp-comm-overlap", FIELD(opts.parallel.tp_comm_overlap),
       "With --sp: overlap the blocks' all-gathers and reduce-scatters with their GEMMs, as Transformer Engine's "
       "userbuffers (NeMo's ub_tp_comm_overlap)"},
      {"--overlap-p2p-comm,!--no-overlap-p2p-comm", FIELD(opts.parallel.overlap_p2p_comm),
       "With --pp: the compute stream waits only for the pipeline's receives (default; Megatron's "
       "overlap_p2p_comm); --no-overlap-p2p-comm: also for each send to leave (batched isend/irecv)"},
      {"--scatter-gather", FIELD(opts.parallel.scatter_gather),
       "Without --sp: each TP rank sends 1/tp of the activations between stages, an all-gather over the TP group "
       "reassembles them (Megatron-LM 2021)"},
      {"--zero", FIELD(opts.parallel.zero),
       "ZeRO stage over dp: 0, 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters: FSDP units)", {},
       kShowDefault},
      {"--use-distributed-optimizer", FIELD(opts.parallel.distributed_optimizer),
       "Megatron's distributed optimizer: --zero 1's memory (every gradient held) with the gradients "
       "reduce-scattered once per step as --zero 2's (--zero 1 alone all-reduces them, as DeepSpeed's stage 1); "
       "sets --zero 1"},
      {"--reshard-after-forward,!--no-reshard-after-forward", FIELD(opts.parallel.reshard_after_forward),
       "ZeRO-3: free each unit after its forward and gather it again for backward (default; off keeps it until "
       "backward)"},
      {"--hsdp", FIELD(opts.parallel.hsdp),
       "ZeRO-3 hybrid sharding: shard over groups of N consecutive dp ranks, replicate across them (gradients "
       "all-reduced over the replicas)",
       degree},
      {"--prefetch,!--no-prefetch", FIELD(opts.parallel.prefetch),
       "ZeRO-3: gather the next unit on the communication stream while this one computes (default)"},
      {"--overlap-param-gather", FIELD(opts.parallel.overlap_param_gather),
       "With --zero 1|2: gather the updated parameters in the next step's forward, each bucket just before its "
       "first use, instead of after the optimizer step (Megatron's --overlap-param-gather)"},
      {"--grad-reduce-in-bf16", FIELD(opts.parallel.grad_reduce_bf16),
       "Mixed precision: keep, accumulate and reduce the main gradients in bf16 (2 bytes) instead of fp32 "
       "(Megatron's --grad-reduce-in-bf16)"},
      {"--bucket-mb", FIELD(opts.parallel.bucket_mb), "DP gradient bucket size in MB", number_above(0, 1e6),
       kShowDefault},
      {"--bucket-per-chunk", FIELD(opts.parallel.chunk_buckets),
       "With --zero 0|1|2: one DP bucket per model chunk instead of --bucket-mb ones (Megatron-core's "
       "disable_bucketing: every chunk after the first, and all with overlap_param_gather_with_optimizer_step)"},
      {"--no-overlap", FIELD(no_overlap), "Reduce DP gradients after backward instead of during it"},
      {"--no-grad-accum-fusion", FIELD(no_grad_accum_fusion),
       "Mixed precision: add every micro-batch's gradients into the fp32 main gradients with a separate kernel "
       "(Megatron-LM 2021) instead of in the wgrad GEMM"},
      {"--ep", FIELD(opts.parallel.ep), "Expert-parallel degree (divides --dp, or with --expert-tp 1 --tp x --dp; --experts / ep experts per GPU)",
       degree, kShowDefault},
      {"--expert-tp", FIELD(opts.parallel.expert_tp),
       "Expert tensor parallelism (Megatron's --expert-tensor-parallel-size): 1 holds every expert whole and draws "
       "the expert-parallel group from --tp x --dp (--ep a multiple of --tp; needs --sp); default --tp, each "
       "expert split like the MLP",
       degree},
      {"--pp", FIELD(opts.parallel.pp), "Pipeline-parallel stages", degree, kShowDefault},
      {"--cp", FIELD(opts.parallel.cp),
       "Context-parallel degree: every sequence split over N ranks (2N chunks, causal load balancing)", degree,
       kShowDefault},
      {"--moe-dispatcher", FIELD(moe_dispatcher),
       "With --ep across nodes: alltoall (Megatron's: one row per token and expert) or deepep (DeepEP's and "
       "HybridEP's: a token crosses to each node holding one of its experts once, is handed to the experts there "
       "over NVLink, and their gate-weighted sum comes back as one row)",
       {}, kShowDefault},
      {"--cp-comm", FIELD(cp_comm), "Context parallelism's K/V exchange: ring (point to point) or allgather", {},
       kShowDefault},
      {"--micro-batches", FIELD(opts.micro_batches),
       "Micro-batches per step (gradient accumulation; the pipeline's M)", degree, kShowDefault},
      {"--schedule", FIELD(schedule),
       "Pipeline schedule: gpipe, 1f1b, interleaved, or zero-bubble zb-h1, zb-h2, zb-v, dualpipev", {},
       kShowDefault},
      {"--vpp", FIELD(opts.parallel.vpp),
       "Model chunks per pipeline rank (interleaved: 2 or more; zb-v and dualpipev: 2, the default)", degree},
      {"--pp-layers", FIELD(pp_layers), "Blocks per stage, e.g. 3,3,2 (default: balanced)", nonempty()},
      {"--recompute", FIELD(recompute),
       "Activation recomputation: none, selective (attention core) or full (whole blocks)", {}, kShowDefault},
      {"--recompute-method", FIELD(recompute_method),
       "Which blocks --recompute full re-runs (Megatron's): uniform (groups of --recompute-num-layers blocks keep "
       "only their input, the default, groups of 1) or block (the first --recompute-num-layers blocks of each stage "
       "and chunk; the others keep everything)",
       nonempty()},
      {"--recompute-num-layers", FIELD(opts.parallel.recompute_num_layers),
       "Blocks in a --recompute-method group (uniform) or re-run per stage (block)", number_in(1, kMaxLayers)},
      {"--recompute-modules", FIELD(recompute_modules),
       "What --recompute selective re-runs, a list of Megatron's recompute_modules separated by , or + (implies selective when "
       "--recompute is none): core_attn (the default), layernorm (an MoE layer's pre-MLP norm), mlp (a dense "
       "block's MLP), moe (an MoE layer), moe_act (the experts' activation), shared_experts",
       nonempty()},
      {"--attention", FIELD(attention),
       "Attention kernels: unfused (scores, softmax, context through HBM), fused (FlashAttention-style), or auto "
       "(unfused for --family gpt, fused for llama)", {}, kShowDefault},
      {"--attention-kernel", FIELD(attention_kernel),
       "Which published fused attention kernel's rates --attention fused charges, where the profile has several "
       "(h100-nvlink, h200-nvlink: cudnn, the default, as Transformer Engine runs on Hopper; fa2, as it runs with "
       "NVTE_FUSED_ATTN=0; fa3)", nonempty()},
      {"--fusions", FIELD(fusions),
       "Element-wise kernels charged fused, a list applied to the default (norm,swiglu,softmax,cross-entropy): "
       "NAME on, no-NAME off, all, none; names: norm, swiglu, softmax, bias-dropout-add, cross-entropy "
       "(time only: the math is the same)", nonempty()},
  };
}

// What train, verify and sweep add to the tables above.
FlagTable<TrainFlags> run_flags() {
  return {
      {"--phantom", FIELD(opts.phantom),
       "Shapes only: run every kernel, collective and allocation on the clock, compute nothing"},
      {"--phantom-routing", FIELD(phantom_routing),
       "Phantom MoE routing assumption: uniform or zipf:S (expert e gets ~1/(e+1)^S)", {}, kShowDefault},
      {"--arithmetic", FIELD(arithmetic),
       "native: the host's fastest GEMM (bits reproducible on this machine); portable: the same bits on every "
       "machine and build, slower",
       {}, kShowDefault},
      {"--no-fold", FIELD(no_fold), "Phantom runs: give every device its own thread (no folding of symmetric ranks)"},
      {"--corrupt-shard", FIELD(opts.corrupt_shard), "NAME:RANK (testing verify)", {}, false, /*hidden=*/true},
      {"--fault", FIELD(faults),
       "Inject a fault (repeatable), or @FILE.json with a list of them: slow-link:A-B:bw=F[,lat_us=+X][,from_step=S], "
       "slow-nic:D:..., link-down:A-B:step=S, straggler:D:compute=F[,from_step=S], dead:D:step=S, "
       "memory:D:capacity=SIZE|FRACTION (README \"Fault injection\")",
       nonempty(), false, false, /*take_all=*/true},
  };
}

FlagTable<TrainFlags> checkpoint_flags() {
  return {
      {"--checkpoint-dir", FIELD(opts.checkpoint_dir),
       "Write sharded checkpoints into DIR (DIR/step-NNNNNN/, DIR/latest) every --checkpoint-every steps and after "
       "the last step",
       nonempty()},
      {"--checkpoint-every", FIELD(checkpoint_every), "Steps between checkpoints (with --checkpoint-dir)",
       number_in(1, kMaxSteps)},
      {"--resume", FIELD(opts.resume_dir),
       "Continue from DIR's latest checkpoint (--steps stays the total; any parallel config: reshards)", nonempty()},
  };
}

#undef FIELD

}  // namespace

void TrainFlags::add(CLI::App* sub) {
  add_common_flags(sub, common);
  for (const FlagTable<TrainFlags>& table : {model_flags(), optimizer_flags(), io_flags(), parallel_flags(), run_flags()})
    add_flags(sub, *this, table);
}

void TrainFlags::add_checkpoint_flags(CLI::App* sub) { add_flags(sub, *this, checkpoint_flags()); }

void TrainFlags::set_modern_moe(model::GPTConfig& c) const {
  c.n_moe_ffn = moe_ffn.value_or(c.n_moe_ffn);
  c.n_shared_expert = shared_experts.value_or(c.n_shared_expert);
  if (!router.empty()) c.router = model::parse_router(router);
  c.moe_norm_topk = moe_norm_topk;
  c.moe_first_dense = moe_first_dense.value_or(c.moe_first_dense);
  c.moe_groups = moe_groups.value_or(c.moe_groups);
  c.moe_group_top_k = moe_group_top_k.value_or(c.moe_group_top_k);
  if (!moe_groups && !moe_group_top_k && (c.n_expert == 0 || !c.moe_groups_fit()))
    c.moe_groups = c.moe_group_top_k = 1;  // the preset's groups do not fit the experts the flags gave: no limit
  if (router_bias_rate)
    c.router_bias_rate = *router_bias_rate;
  else if (c.n_expert == 0 || c.top_k >= c.n_expert)
    c.router_bias_rate = 0;  // the preset's bias needs routed experts to choose among
}

void TrainFlags::apply_family_flags(model::GPTConfig& c) const {
  if (!family.empty()) c.family = family == "llama" ? model::Family::kLlama : model::Family::kGpt;
  if (kv_heads) c.n_kv_head = *kv_heads;
  if (head_dim) c.head_dim = *head_dim;
  if (qk_norm) c.qk_norm = true;
  if (kv_lora_rank) c.kv_lora_rank = *kv_lora_rank;
  if (q_lora_rank) c.q_lora_rank = *q_lora_rank;
  if (qk_rope_head_dim) c.qk_rope_head_dim = *qk_rope_head_dim;
  if (v_head_dim) c.v_head_dim = *v_head_dim;
  if (rope_theta) c.rope_theta = *rope_theta;
  if (norm_eps) c.norm_eps = *norm_eps;
  if (tie_embeddings && no_tie_embeddings)
    throw ConfigError("--tie-embeddings and --no-tie-embeddings contradict each other: give one");
  if (tie_embeddings || no_tie_embeddings) c.tie_embeddings = tie_embeddings;
}

model::GPTConfig TrainFlags::model_config() const {
  const model::PresetInfo& info = model::preset_info(model);
  model::GPTConfig c = info.config;
  auto set = [](int& field, int value) {  // 0: not given (each flag's check refuses an explicit 0)
    if (value != 0) field = value;
  };
  set(c.n_layer, layers);
  set(c.n_head, heads);
  set(c.n_embd, embd);
  set(c.vocab_size, vocab);
  set(c.block_size, seq);
  set(c.batch_size, batch);
  if (ffn) c.n_ffn = *ffn;  // else the preset's (llama's published widths; 0: 4 x embd)
  c.n_expert = experts.value_or(c.n_expert);
  c.top_k = top_k.value_or(c.top_k);
  c.moe_every = moe_every.value_or(c.moe_every);
  // Unset: the preset's (deepseek-v3 is aux-loss-free: 0), 0.01 for experts added to a dense preset.
  c.aux_coef = aux_coef >= 0 ? aux_coef : (c.n_expert == 0 ? 0.0 : info.config.is_moe() ? info.config.aux_coef : 0.01);
  c.capacity_factor = capacity_factor;
  set_modern_moe(c);
  c.dropout = dropout;
  apply_family_flags(c);
  const int multiple = vocab_divisible_by.value_or(info.pads_vocab && vocab == 0 ? 128 : 0);
  const int tp = opts.parallel.tp;
  if (multiple > 0 && tp >= 1 && c.vocab_size >= 2) c = model::with_padded_vocab(c, multiple, tp);
  return c;
}

namespace {

// "uniform" -> 0, "zipf:S" -> S; anything else is one error line.
double parse_phantom_routing(const std::string& text) {
  if (text == "uniform") return 0;
  if (text.starts_with("zipf:")) {
    const double s = parse_number<double>(std::string_view(text).substr(5)).value_or(0);
    if (s > 0 && s <= 100) return s;
  }
  throw ConfigError(fmt::format("--phantom-routing: \"{}\" is not uniform or zipf:S with 0 < S <= 100", text));
}

}  // namespace

train::TrainOptions TrainFlags::options() const {
  train::TrainOptions o = opts;  // the fields the flags set directly
  o.model = model_config();
  o.lr_schedule = train::parse_lr_schedule(lr_schedule);
  o.sampling = model::parse_sampling(sampling);
  o.parallel.overlap = !no_overlap;
  // Megatron's flag alone means ZeRO-1's sharding; with --zero 2 or 3 the library refuses it.
  if (o.parallel.distributed_optimizer && o.parallel.zero == 0) o.parallel.zero = 1;
  o.parallel.grad_accum_fusion = !no_grad_accum_fusion;
  o.parallel.cp_comm = parallel::parse_cp_comm(cp_comm);
  o.parallel.moe_dispatcher = parallel::parse_moe_dispatcher(moe_dispatcher);
  o.parallel.schedule = parallel::parse_schedule(schedule);
  o.parallel.recompute = parallel::parse_recompute(recompute);
  if (!recompute_method.empty()) o.parallel.recompute_method = parallel::parse_recompute_method(recompute_method);
  if (!recompute_modules.empty()) {
    o.parallel.recompute_modules = parallel::parse_recompute_modules(recompute_modules);
    if (o.parallel.recompute == parallel::Recompute::kNone) o.parallel.recompute = parallel::Recompute::kSelective;
  }
  o.parallel.attention = parallel::parse_attention_kernel(attention);
  if (std::string error; !fusions.empty() && !model::parse_fusions(fusions, o.parallel.fusions, error))
    throw ConfigError("--fusions: " + error);
  if (!pp_layers.empty()) o.parallel.stage_layers = parallel::parse_stage_layers(pp_layers);
  o.checkpoint_every = checkpoint_every.value_or(0);  // an explicit 0 is refused by its flag's check
  o.fold = !no_fold;
  o.phantom_zipf = parse_phantom_routing(phantom_routing);
  const auto chosen = model::parse_arithmetic(arithmetic);
  if (!chosen) throw ConfigError(fmt::format("--arithmetic: \"{}\" is not native or portable", arithmetic));
  o.arithmetic = *chosen;
  o.validate();  // every check of the options, in the library
  // --attention-kernel picks the rates of a fused kernel: a run that charges
  // none (the unfused core without --cp, whose ring blocks are fused), or
  // charges it at the GEMM model (fp32: the rates are BF16's), has no use
  // for it, and silently ignoring it would hide a mistaken run.
  if (!attention_kernel.empty()) {
    if (!parallel::fused_attention(o.parallel.attention, o.model.is_llama()) && o.parallel.cp == 1)
      throw ConfigError(fmt::format("--attention-kernel {}: this run charges no fused attention kernel (the unfused "
                                    "core: --attention unfused, or auto on the GPT family); add --attention fused",
                                    attention_kernel));
    if (precision == "fp32")
      throw ConfigError(fmt::format("--attention-kernel {}: the kernels' published rates are BF16's, and an fp32 run "
                                    "charges its attention at the GEMM model; add --precision bf16 or fp8",
                                    attention_kernel));
  }
  return o;
}

HardwareProfile TrainFlags::profile() const {
  HardwareProfile p = apply_common(common);
  select_attention_kernel(p, attention_kernel);
  return p;
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
  else if (precision == "fp8") c.precision = Precision::kFp8;
  else throw ConfigError(fmt::format("--precision: unknown \"{}\" (fp32, bf16, fp8)", precision));
  if (opts.parallel.grad_reduce_bf16 && c.precision == Precision::kFp32)
    throw ConfigError("--grad-reduce-in-bf16 needs --precision bf16 or fp8 (in fp32 the gradients are the weights' own)");
  c.pace = common.pace;
  c.world_size = opts.parallel.world();
  c.trace = !common.trace.empty();
  if (!faults.empty()) c.faults = std::make_shared<const FaultPlan>(parse_faults(faults), c.world_size, opts.steps);
  return c;
}

}  // namespace shardlab::cli
