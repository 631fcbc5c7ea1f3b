#include "cli/field_flags.h"

#include <array>
#include <utility>

namespace shardlab::cli {
namespace {

// {field as the library's messages name it, the flag that sets it}.
constexpr std::array kFieldFlags = std::to_array<std::pair<std::string_view, std::string_view>>({
    {"dp", "--dp"},
    {"tp", "--tp"},
    {"sp", "--sp"},
    {"tp_comm_overlap", "--tp-comm-overlap"},
    {"overlap_moe_comm", "--overlap-moe-expert-parallel-comm"},
    {"delay_wgrad", "--delay-wgrad-compute"},
    {"overlap_p2p_comm", "--no-overlap-p2p-comm"},
    {"ep", "--ep"},
    {"expert_tp", "--expert-tp"},
    {"cp", "--cp"},
    {"cp_comm", "--cp-comm"},
    {"moe_dispatcher", "--moe-dispatcher"},
    {"zero", "--zero"},
    {"distributed_optimizer", "--use-distributed-optimizer"},
    {"attention", "--attention"},
    {"hsdp", "--hsdp"},
    {"overlap_param_gather", "--overlap-param-gather"},
    {"grad_reduce_bf16", "--grad-reduce-in-bf16"},
    {"bucket_mb", "--bucket-mb"},
    {"chunk_buckets", "--bucket-per-chunk"},
    {"scatter_gather", "--scatter-gather"},
    {"dropout", "--dropout"},
    {"batch_size", "--batch"},
    {"n_head", "--heads"},
    {"n_embd", "--embd"},
    {"n_ffn", "--ffn"},
    {"vocab_size", "--vocab"},
    {"n_expert", "--experts"},
    {"capacity_factor", "--capacity-factor"},
    {"pp", "--pp"},
    {"vpp", "--vpp"},
    {"micro_batches", "--micro-batches"},
    {"schedule", "--schedule"},
    {"algo", "--algo"},
    {"stage_layers", "--pp-layers"},
    {"n_layer", "--layers"},
    {"block_size", "--seq"},
    {"workload", "--workload"},
    {"prompt_len", "--prompt-len"},
    {"output_len", "--output-len"},
    {"max_seqs", "--max-seqs"},
    {"max_batch_tokens", "--max-batch-tokens"},
    {"chunked_prefill", "--chunked-prefill"},
    {"prefix_caching", "--prefix-caching"},
    {"speculative", "--speculative"},
    {"disaggregate", "--disaggregate"},
    {"batching", "--batching"},
    {"kv_fraction", "--kv-fraction"},
    {"arrival", "--arrival"},
    {"phantom", "--phantom"},
    {"init", "--init"},
    {"prompt", "--prompt-tokens"},
    {"max_new_tokens", "--max-new-tokens"},
    {"kv_cache_dtype", "--kv-cache-dtype"},
    {"temperature", "--temperature"},
    {"top_k", "--top-k"},
    {"top_p", "--top-p"},
    {"n_moe_ffn", "--moe-ffn"},
    {"n_shared_expert", "--shared-experts"},
    {"router", "--router"},  // serve's request routing; the MoE router's is GPTConfig::router
    {"GPTConfig::router", "--moe-router"},
    {"moe_first_dense", "--moe-first-dense"},
    {"moe_groups", "--moe-groups"},
    {"moe_group_top_k", "--moe-group-top-k"},
    {"router_bias_rate", "--router-bias-rate"},
    {"n_kv_head", "--kv-heads"},
    {"head_dim", "--head-dim"},
    {"qk_norm", "--qk-norm"},
    {"q_lora_rank", "--q-lora-rank"},
    {"kv_lora_rank", "--kv-lora-rank"},
    {"qk_rope_head_dim", "--qk-rope-head-dim"},
    {"v_head_dim", "--v-head-dim"},
    {"rope_theta", "--rope-theta"},
    {"norm_eps", "--norm-eps"},
    {"family", "--family"},
    {"GPTConfig::top_k", "--moe-top-k"},  // sampling's `top_k` is --top-k
    {"moe_every", "--moe-every"},
    {"aux_coef", "--aux-coef"},
    {"make_vocab_size_divisible_by", "--make-vocab-size-divisible-by"},
    // TrainOptions (the loop, optimizer, files)
    {"steps", "--steps"},
    {"lr", "--lr"},
    {"beta1", "--beta1"},
    {"beta2", "--beta2"},
    {"eps", "--eps"},
    {"weight_decay", "--weight-decay"},
    {"grad_clip", "--grad-clip"},
    {"warmup_steps", "--warmup-steps"},
    {"lr_schedule", "--lr-schedule"},
    {"phantom_zipf", "--phantom-routing"},
    {"init_path", "--init"},
    {"save_path", "--save"},
    {"checkpoint_dir", "--checkpoint-dir"},
    {"checkpoint_every", "--checkpoint-every"},
    {"resume_dir", "--resume"},
    {"corrupt_shard", "--corrupt-shard"},
    {"data", "--data"},
    {"sampling", "--sampling"},
    {"faults", "--fault"},
    {"vary", "--vary"},
    {"metric", "--metric"},
    {"preset", "--model"},
    {"trace", "--trace"},
    {"recompute", "--recompute"},
    {"recompute_modules", "--recompute-modules"},
    {"recompute_method", "--recompute-method"},
    {"recompute_num_layers", "--recompute-num-layers"},
    {"reshard_after_forward = false", "--no-reshard-after-forward"},
    {"prefetch = false", "--no-prefetch"},
    {"overlap = false", "--no-overlap"},
});

}  // namespace

std::string with_flag_names(std::string_view message) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const size_t open = message.find('`', i);
    const size_t close = open == std::string_view::npos ? open : message.find('`', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view field = message.substr(open + 1, close - open - 1);
    out += message.substr(i, open - i);
    std::string_view shown = message.substr(open, close - open + 1);
    for (const auto& [name, flag] : kFieldFlags)
      if (name == field) shown = flag;
    out += shown;
    i = close + 1;
  }
  out += message.substr(i);
  return out;
}

std::string with_flag_hint(std::string_view message) {
  constexpr std::string_view kTail = " was given a disallowed flag override";
  if (message.size() <= kTail.size() || !message.ends_with(kTail)) return std::string(message);
  const std::string flag = "--" + std::string(message.substr(0, message.size() - kTail.size()));
  return flag + " is an on/off flag and takes no value: write " + flag + " alone to turn it on";
}

}  // namespace shardlab::cli
