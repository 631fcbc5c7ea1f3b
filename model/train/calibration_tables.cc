// The published runs the clock is checked against: each table's rows with
// their sources and how the source ran them (the data). How a row becomes
// TrainOptions and a prediction is calibration.cc (the logic).
#include "model/train/calibration.h"

#include "model/parallel/data/buckets.h"

namespace shardlab::train {

// Rows: {preset, tp, pp, gpus, published TFLOP/s, batch, micro-batch size,
// chunks per rank, overlap}.
const std::vector<PublishedRun>& narayanan2021_table1() {
  // run_table_1.sh: MBS, --num-layers-per-virtual-pipeline-stage, --DDP-impl.
  static const std::vector<PublishedRun> kRows = {
      {"megatron-1.7b", 1, 1, 32, 137, 0, 16, 0, true},
      {"megatron-3.6b", 2, 1, 64, 138, 0, 16, 0, true},
      {"megatron-7.5b", 4, 1, 128, 142, 0, 16, 0, true},
      {"megatron-18.4b", 8, 1, 256, 135, 0, 8, 0, true},
      {"megatron-39.1b", 8, 2, 512, 138, 0, 4, 1},     // 1F1B
      {"megatron-76.1b", 8, 4, 1024, 140, 0, 2, 3},    // 5 of a stage's 15 layers per chunk
      {"megatron-145.6b", 8, 8, 1536, 148, 0, 2, 2},   // 5 of 10
      {"megatron-310.1b", 8, 16, 1920, 155, 0, 1, 2},  // 3 of 6
      {"megatron-529.6b", 8, 35, 2520, 163, 0, 1, 3},  // 1 of 3
      {"megatron-1t", 8, 64, 3072, 163, 0, 1, 1},      // 1F1B
  };
  return kRows;
}

const std::vector<PublishedRun>& narayanan2021_table2() {
  // Model-parallel size 96 (TP 8 x PP 12, 8 of the 96 layers per stage, 2 per
  // chunk) and 280 (TP 8 x PP 35, 3 of 105, 1 per chunk); micro-batch 1.
  static const std::vector<PublishedRun> kRows = {
      {"gpt3-175b", 8, 12, 384, 153, 1536, 1, 4},
      {"gpt3-175b", 8, 12, 768, 149, 1536, 1, 4},
      {"gpt3-175b", 8, 12, 1536, 141, 1536, 1, 4},
      {"megatron-529.6b", 8, 35, 560, 171, 2240, 1, 3},
      {"megatron-529.6b", 8, 35, 1120, 167, 2240, 1, 3},
      {"megatron-529.6b", 8, 35, 2240, 159, 2240, 1, 3},
  };
  return kRows;
}

const std::vector<PublishedRun>& korthikanti2022_table5() {
  // Table 3's models (22B: 48 layers of h 6144, 64 heads), Table 5's
  // iteration times: full recomputation, then "present work" (SP + selective).
  // {preset, tp, pp, gpus, -, batch, micro-batch size, chunks per rank,
  //  overlap, sp_selective, layers, heads, iteration s, gradient accumulation fusion}
  static const std::vector<PublishedRun> kRows = {
      {"megatron-18.4b", 8, 1, 8, 0, 4, 4, 0, false, false, 48, 64, 1.42, true},
      {"megatron-18.4b", 8, 1, 8, 0, 4, 4, 0, false, true, 48, 64, 1.10, true},
      {"gpt3-175b", 8, 8, 64, 0, 64, 1, 3, false, false, 0, 0, 18.13, true},
      {"gpt3-175b", 8, 8, 64, 0, 64, 1, 3, false, true, 0, 0, 13.75, true},
      {"megatron-529.6b", 8, 35, 280, 0, 280, 1, 3, false, false, 0, 0, 49.05, true},
      {"megatron-529.6b", 8, 35, 280, 0, 280, 1, 3, false, true, 0, 0, 37.83, true},
      {"megatron-1t", 8, 64, 512, 0, 512, 1, 1, false, false, 0, 0, 94.42, true},
      {"megatron-1t", 8, 64, 512, 0, 512, 1, 1, false, true, 0, 0, 71.49, true},
  };
  return kRows;
}

// NVIDIA's "Performance Summary for Large Language Models" (NeMo docs,
// 24.07 container, pre-training, DGX-H100, FP8): model, GPUs, GBS, MBS, seq,
// TP, PP, CP, VP, tokens/s per GPU and model TFLOP/s per GPU, as published.
// The runs are NVIDIA/NeMo-Framework-Launcher 24.07's
// examples/training/{gpt,llama}/h100/*_fp8*.sh on its
// launcher_scripts/conf/training/gpt3/{5b,20b,175b}.yaml and
// llama/llama2_{7b,70b}.yaml (the table's GBS, MBS, TP, PP and VP where the
// example scripts differ: 20B's GBS 256, 175B's VP 6 and MBS 2 on 512):
//  - shapes: GPT-3 5B 24 layers of 4096, 32 heads; 20B 44 of 6144, 48 heads;
//    175B 96 of 12288, 96 heads; FFN 4h, GPT2BPETokenizer (50257), dropout
//    0.1 (hidden and attention); Llama 2 as released (presets), dropout 0;
//    make_vocab_size_divisible_by 128 (x TP: 50304, 50432, 50688; 32000,
//    32256 at TP 4);
//  - fp8: True, fp8_hybrid (E4M3 forward, E5M2 backward), delayed scaling
//    over an amax history of 1024 (Llama 2 70B's conf: 1), fp8_wgrad;
//  - transformer_engine, mcore_gpt: TE's fused attention, FlashAttention-2:
//    the launcher's conf/config.yaml sets NVTE_FUSED_ATTN: 0 for every run
//    ("Disable cudnn FA until we've tested it more", 24.01 to 24.07; 24.09
//    turned cuDNN's on), so TE skips cuDNN's kernel and runs the flash-attn
//    package's (PublishedRun::attention_kernel "fa2"); fused LayerNorm/RMSNorm
//    (persist_layer_norm), bias-GELU / SwiGLU fusion;
//  - no activation recomputation (activations_checkpoint_granularity null);
//  - sequence_parallel True where TP > 1 (20b, 175b, llama2_70b);
//  - optim distributed_fused_adam (Apex: gradients reduce-scattered, the
//    parameters all-gathered, overlap_grad_sync and overlap_param_sync True,
//    bucket_cap_mb 400 / 220 / 220 / 125 / 125),
//    +optim.grad_sync_dtype=bf16 in every example script;
//  - gradient_accumulation_fusion True; no cross_entropy_loss_fusion key
//    (Megatron-core's vocab-parallel cross-entropy);
//  - ub_tp_comm_overlap True for 20B and Llama 2 70B, False for 5B, 175B
//    and Llama 2 7B (PublishedRun::tp_comm_overlap);
//  - overlap_p2p_comm True, batch_p2p_comm False for 175B and Llama 2 70B
//    (interleaved); False / True for the others, which have no pipeline
//    (PublishedRun::overlap_p2p_comm).
// GPT-3 5B and 20B are NeMo's shapes on gpt3-6.7b's and gpt3-13b's preset
// (GPT-2's vocabulary, seq 2048, FFN 4h) with the launcher's layers, width
// and heads.
namespace {
PublishedRun nemo(const char* name, const char* preset, int gpus, int batch, int mbs, int seq,
                  int tp, int pp, int vp, double tokens, double tflops, double bucket_mb,
                  bool tp_comm_overlap = false, bool overlap_p2p_comm = false) {
  return {.preset = preset, .tp = tp, .pp = pp, .gpus = gpus, .tflops_per_gpu = tflops,
          .batch = batch, .micro_batch_size = mbs, .vpp = vp, .overlap = true,
          .grad_accum_fusion = true, .recipe = Recipe::kNeMo2024, .seq = seq,
          .precision = Precision::kFp8, .tokens_per_gpu_s = tokens, .bucket_mb = bucket_mb,
          .name = name, .tp_comm_overlap = tp_comm_overlap, .overlap_p2p_comm = overlap_p2p_comm,
          .grad_reduce_bf16 = true};
}
// NeMo-Framework-Launcher 24.01-24.07's runs (24.03.01's long sequences too):
// FlashAttention-2 (above).
PublishedRun nemo_launcher_2024(PublishedRun r) {
  r.attention_kernel = "fa2";
  return r;
}
PublishedRun reshaped(PublishedRun r, int layers, int embd, int heads) {
  r.layers = layers, r.embd = embd, r.heads = heads;
  return r;
}
}  // namespace

const std::vector<PublishedRun>& nemo2407_h100_fp8() {
  // name, preset, GPUs, GBS, MBS, seq, TP, PP, VP, tokens/s/GPU, TFLOP/s/GPU, bucket_cap_mb,
  // ub_tp_comm_overlap, overlap_p2p_comm
  static const std::vector<PublishedRun> kRows = {
      nemo_launcher_2024(
          reshaped(nemo("GPT3-5B", "gpt3-6.7b", 64, 2048, 4, 2048, 1, 1, 1, 22521, 736, 400), 24, 4096, 32)),
      nemo_launcher_2024(
          reshaped(nemo("GPT3-20B", "gpt3-13b", 64, 256, 2, 2048, 2, 1, 1, 5851, 750, 220, true), 44, 6144, 48)),
      nemo_launcher_2024(nemo("GPT3-175B", "gpt3-175b", 128, 256, 1, 2048, 4, 8, 6, 726, 782, 220, false, true)),
      nemo_launcher_2024(nemo("GPT3-175B", "gpt3-175b", 512, 2048, 2, 2048, 4, 8, 6, 782, 842, 220, false, true)),
      nemo_launcher_2024(nemo("LLAMA2-7B", "llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 16847, 776, 125)),
      nemo_launcher_2024(nemo("LLAMA2-70B", "llama2-70b", 64, 128, 1, 4096, 4, 4, 20, 1707, 759, 125, true, true)),
  };
  return kRows;
}

// The same 24.07 summary's other DGX-H100 FP8 rows of the Llama family
// (NVIDIA/NeMo docs/source/performance/performance_summary.md as first
// published, 4c73f77670, the commit of the six rows above), held out of
// every fit: LLAMA2-13B (16 GPUs, GBS 128, TP 1, PP 4, VP 10, 8646
// tokens/s/GPU), LLAMA3-8B (8 GPUs, GBS 128, seq 8192, CP 2, 12036) and
// LLAMA3-70B (64 GPUs, GBS 128, seq 8192, TP 4, PP 4, CP 2, VP 5, 1533), MBS
// 1 each. Their launcher runs (NeMo-Framework-Launcher 24.07,
// examples/training/llama/h100/{llama2_13b,llama3_8b,llama3_70b}_fp8.sh on
// conf/training/llama/*.yaml) set what the rows above set (fp8_hybrid,
// distributed_fused_adam with bucket_cap_mb 125 and overlapped grad and
// param sync, grad_sync_dtype bf16, gradient_accumulation_fusion, TE's
// fused attention, no recomputation), and: overlap_p2p_comm with PP;
// sequence_parallel and ub_tp_comm_overlap for 70B only
// (ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192); cross_entropy_loss_fusion
// for the two Llama 3 rows. The Nemotron rows of that table are not run
// (no Nemotron preset here).
const std::vector<PublishedRun>& nemo2407_h100_fp8_heldout() {
  static const std::vector<PublishedRun> kRows = [] {
    PublishedRun l13 = nemo("LLAMA2-13B", "llama2-13b", 16, 128, 1, 4096, 1, 4, 10, 8646, 754, 125, false, true);
    PublishedRun l8 = nemo("LLAMA3-8B", "llama3-8b", 8, 128, 1, 8192, 1, 1, 1, 12036, 697, 125);
    l8.cp = 2;
    l8.fused_cross_entropy = true;
    PublishedRun l70 = nemo("LLAMA3-70B", "llama3-70b", 64, 128, 1, 8192, 4, 4, 5, 1533, 738, 125, true, true);
    l70.cp = 2;
    l70.fused_cross_entropy = true;
    return std::vector<PublishedRun>{nemo_launcher_2024(l13), nemo_launcher_2024(l8), nemo_launcher_2024(l70)};
  }();
  return kRows;
}

// NeMo's long-sequence table (NVIDIA/NeMo
// docs/source/performance/performance_long_sequence.md, added in 5b47a94c11,
// "LLAMA2-7B (FP8)", container NeMo 24.03.01, DGX-H100): model TFLOP/s per
// GPU with CP at sequence lengths of 4K to 1M on as many GPUs as the length
// has K tokens, and the TP, PP, DP and CP of each run. Held out of every fit.
// As published: MBS, GBS, recomputation and the other settings are not. Each
// row runs as the rows of nemo2407_h100_fp8 run (NeMo-Framework-Launcher's
// llama2_7b.yaml at 24.03.01: MBS 1, no recomputation, the distributed
// optimizer with bucket_cap_mb 125 and overlapped grad and param sync, no
// TP overlap; sequence parallelism with TP), with the launcher's
// FlashAttention-2 (24.03.01's conf/config.yaml: NVTE_FUSED_ATTN: 0) and a
// global batch of 4M tokens (4,194,304 / seq sequences: what the same page's
// later B200 long-sequence table publishes for every row of its own). The
// TFLOP/s are NeMo's count of the time, the causal attention not halved.
const std::vector<PublishedRun>& nemo2403_h100_fp8_long_sequence() {
  // name, K tokens a sequence (= GPUs), TP, PP, CP, published TFLOP/s per GPU
  struct Row {
    const char* name;
    int k, tp, pp, cp;
    double tflops;
  };
  static const std::vector<PublishedRun> kRows = [] {
    const Row table[] = {{"LLAMA2-7B 4K", 4, 1, 1, 1, 768},        {"LLAMA2-7B 8K", 8, 1, 2, 1, 730},
                         {"LLAMA2-7B 16K", 16, 2, 1, 1, 660},      {"LLAMA2-7B 32K", 32, 2, 1, 2, 610},
                         {"LLAMA2-7B 64K", 64, 4, 1, 2, 574},      {"LLAMA2-7B 128K", 128, 4, 1, 4, 555},
                         {"LLAMA2-7B 256K", 256, 4, 1, 8, 549},    {"LLAMA2-7B 512K", 512, 8, 1, 16, 549},
                         {"LLAMA2-7B 1M", 1024, 8, 1, 32, 536}};
    std::vector<PublishedRun> rows;
    for (const Row& t : table) {
      const int seq = t.k * 1024;
      PublishedRun r = nemo_launcher_2024(nemo(t.name, "llama2-7b", t.k, (4 << 20) / seq, 1, seq, t.tp,
                                               t.pp, 1, 0, t.tflops, 125, false, t.pp > 1));
      r.cp = t.cp;
      rows.push_back(r);
    }
    return rows;
  }();
  return kRows;
}

// Dubey et al. 2024, Table 4: Llama 3 405B (126 layers), BF16, 16M tokens
// per batch, micro-batch 1 (batch size per DP 32, 16 and 16): TP 8 x PP 16 x
// DP 64 on 8,192 GPUs (430 TFLOP/s per GPU), DP 128 on 16,384 (400), and CP
// 16 x DP 8 at seq 131,072 on 16,384 (380). Sec. 3.3.2 says how they ran:
//  - interleaved 1F1B with V virtual stages per rank, one layer taken off
//    the first and the last stage so that "the first model chunk on the
//    first stage has only the embedding, and the last model chunk on the
//    last stage has only output projection and loss calculation": chunks of
//    one layer, so V = 8 (126 + 2 slots over 16 ranks) and empty end stages;
//  - asynchronous point-to-point sends; no activation checkpointing ("we could
//    pre-train Llama 3 on 8K tokens without activation checkpointing", having
//    freed each stage's inputs and outputs early, which shardlab's memory
//    accounting does not model: the rows run with 160 GiB of device memory,
//    time unaffected, and report the peak they would need);
//  - FSDP over dp sharding optimizer states and gradients but not the
//    parameters after the forward, gradients reduce-scattered in FP32. Run
//    here as ZeRO-1 (fp32 gradients all-reduced, parameters all-gathered,
//    overlapped with the backward), whose replicas fold (ZeRO-2's
//    reduce-scatter over 64 nodes does not: 1,024 threads);
//  - FLOP/s counted with the causal attention halved: with the full count no
//    single GEMM maximum fits both the 8K and the 128K rows (at 0.60: +5%
//    and +45%), with the half count all three within 4%, as Megatron-Bridge's
//    tables count it.
// Not given, shardlab's defaults: fused attention (cuDNN's rates), no TP
// overlap, Megatron-core's unfused cross-entropy, fp32 gradient accumulation fused.
// Their network (h100-roce) is run flat (h100-nvlink: the same 400 Gb/s per
// GPU): the static share of a pod's 1:7 uplinks ("The cluster fabric")
// assumes every host below sends at once, which the dp rings of these runs
// (two pod crossings each) do not.
const std::vector<PublishedRun>& dubey2024_table4() {
  auto row = [](const char* name, int gpus, int cp, int seq, int batch, double tflops) {
    PublishedRun r = nemo(name, "llama3-405b", gpus, batch, 1, seq, 8, 16, 8, 0, tflops, 0, false, true);
    r.precision = Precision::kBf16;
    r.cp = cp;
    r.zero = 1;
    r.causal_flops_halved = true;
    r.embedding_loss_in_split = true;
    r.grad_reduce_bf16 = false;  // gradients reduce-scattered in FP32 (the note above)
    r.memory_gib = 160;
    return r;
  };
  static const std::vector<PublishedRun> kRows = {row("Llama 3 405B", 8192, 1, 8192, 2048, 430),
                                                  row("Llama 3 405B", 16384, 1, 8192, 2048, 400),
                                                  row("Llama 3 405B, CP 16, seq 131072", 16384, 16, 131072, 128, 380)};
  return kRows;
}

// Megatron-Bridge's performance summary (docs/performance-summary-archive.md,
// "25.11 NeMo Container", System: DGX-H100; FP8-CS is Transformer Engine's
// current scaling, whose cost shardlab models as its delayed scaling: one
// cast per operand, the amax fused in). The recipes
// (scripts/performance/configs/llama: set_llama3_common_configs and the
// workload base configs): seq 8192, vocabulary 128256 padded, gradients
// reduced in bf16, the cross-entropy fused (cross_entropy_loss_fusion,
// the llama recipes' TE kernel); 8B with Megatron-FSDP over its 8 GPUs (`--zero 3`) and no
// gradient-accumulation fusion (the recipe turns it off under FSDP), no
// recomputation; 70B with the distributed optimizer and TE's userbuffers TP
// overlap (userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192); 405B likewise
// with CP 2 (userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192) and the
// embedding and the loss each a layer's slot in the pipeline split
// (llama31_405b_pretrain_config's account_for_embedding_in_pipeline_split
// and account_for_loss_in_pipeline_split; PublishedRun::embedding_loss_in_split). Their
// model TFLOP/s count the causal attention at half (published TFLOP/s over
// tokens/s), so the error is taken over tokens/s, as for the 24.07 rows.
// The data-parallel buckets of the interleaved rows (dp > 1): one per model
// chunk (PublishedRun::chunk_buckets). Megatron-Bridge's _ddp_wrap
// (src/megatron/bridge/models/model_provider.py:688, at e59a573) sets
// disable_bucketing for every chunk after the first, and for all of them
// with overlap_param_gather_with_optimizer_step, which the performance
// scripts turn on when dp > 1, pp > 1 and vp > 1
// (scripts/performance/utils/helpers.py:260-263); the chunk-0 gather
// that flag issues during the optimizer step is not modeled (the
// interleaved schedule gathers chunks 0 and 1 as the step starts).
// Not modeled either: fp8_param_gather (get_precision_config "fp8_cs":
// bf16_with_fp8_current_scaling_mixed, src/megatron/bridge/training/
// mixed_precision.py:289), FP8 weights gathered at 1 B, in buffers of
// their own dtype; every gather here moves 2 B per parameter.
const std::vector<PublishedRun>& megatron_bridge2511_h100_fp8() {
  auto row = [](const char* name, const char* preset, int gpus, int batch, int tp, int pp, int vp, double tokens,
                double tflops, bool tp_overlap) {
    PublishedRun r = nemo(name, preset, gpus, batch, 1, 8192, tp, pp, vp, tokens, tflops, 0, tp_overlap, pp > 1);
    r.causal_flops_halved = true;
    r.fused_cross_entropy = true;
    return r;
  };
  static const std::vector<PublishedRun> kRows = [&] {
    PublishedRun fsdp = row("LLAMA3_8B", "llama3-8b", 8, 128, 1, 1, 1, 14451, 744, false);
    fsdp.zero = 3;
    fsdp.grad_accum_fusion = false;
    PublishedRun cp = row("LLAMA3.1_405B", "llama3-405b", 1024, 512, 8, 8, 8, 292, 737, true);
    cp.cp = 2;
    cp.embedding_loss_in_split = true;
    cp.chunk_buckets = true;  // dp 8
    PublishedRun l70 = row("LLAMA3_70B", "llama3-70b", 64, 128, 4, 8, 5, 1602, 719, true);
    l70.chunk_buckets = true;  // dp 2
    return std::vector<PublishedRun>{fsdp, l70, cp};
  }();
  return kRows;
}

// The same summary's later DGX-H100 rows of the same two models, "26.04.01
// NeMo Container" (the latest release listing both): Megatron-Bridge
// v0.4.x's scripts/performance/configs/llama keep the 25.11 layouts
// (LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS_V2: TP 4, PP 8, VP 5; the 405B
// row TP 8, PP 8, CP 2, VP 8; MBS 1, seq 8192) and raise the global batch
// (70B: BASE_LLAMA3_70B_CONFIG_GBS256, 256; 405B: 1,536), so they check
// the batch's effect (more micro-batches per pipeline flush) beside
// everything the 25.11 rows check; every other setting is the 25.11 row's.
// Held out of every fit. The other releases' figures for the same rows
// (README "Held out: Megatron-Bridge's DGX-H100 FP8 rows"): 70B 1621
// (26.02), 1639 (26.02.01), 1633 (26.04) tokens/s/GPU; 405B 311 (26.02),
// 326 (26.06).
const std::vector<PublishedRun>& megatron_bridge2604_h100_fp8() {
  static const std::vector<PublishedRun> kRows = [] {
    std::vector<PublishedRun> rows = megatron_bridge2511_h100_fp8();
    rows.erase(rows.begin());  // no DGX-H100 Llama 3 8B row after 25.11
    rows[0].batch = 256, rows[0].tokens_per_gpu_s = 1664, rows[0].tflops_per_gpu = 731;
    rows[1].batch = 1536, rows[1].tokens_per_gpu_s = 328, rows[1].tflops_per_gpu = 827;
    return rows;
  }();
  return kRows;
}

// The same summary's DGX-B200 rows (25.11, FP8-CS), as Megatron-Bridge
// v0.2.0 (the 25.11 container's) scripts/performance/configs/llama3 and
// llama31 set them: set_llama3(1)_common_configs as above (seq 8192,
// vocabulary 128256 padded, gradients reduced in bf16), TE's fused
// cross-entropy (the llama recipes' cross_entropy_fusion_impl "te"),
// the distributed optimizer with overlap_grad_reduce and
// overlap_param_gather (_llama3_common), FP8 current scaling with no BF16
// first and last layers (get_precision_config "fp8_cs"), no recomputation:
//  - LLAMA3_8B_B200_FP8_CS_BASE_CONFIG: 8 GPUs, GBS 128, MBS 2, TP 1 (DP 8,
//    8 micro-batches: the table's GA 8), no FSDP (so the gradient
//    accumulation stays fused), CUDA graphs over the full iteration (not
//    modeled: shardlab charges each kernel its 4 us launch, about 1% of
//    this step);
//  - LLAMA31_405B_B200_FP8_CS_BASE_CONFIG: 128 GPUs, GBS 64, TP 4, PP 8, CP
//    2, VP 8 (DP 2, 32 micro-batches: GA 32), TE's userbuffers TP overlap
//    (llama31_405b_pretrain_config's tp_comm_overlap,
//    userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192), the embedding
//    and the loss each a layer's slot in the pipeline split (its
//    account_for_embedding_in_pipeline_split and
//    account_for_loss_in_pipeline_split: 126 + 2 slots, 2 per chunk), one
//    data-parallel bucket per model chunk (dp 2: as the H100 rows above).
// The 8B row's buckets: 128 Mi parameters (src/megatron/bridge/training/
// comm_overlap.py:540, whenever dp > 1), 536.870912 MB in shardlab's
// bucket_mb, which counts 4 B per gradient (kGradElemBytes).
// Published TFLOP/s count the causal attention at half; the error is over
// tokens/s.
const std::vector<PublishedRun>& megatron_bridge2511_b200() {
  auto row = [](const char* name, const char* preset, int gpus, int batch, int mbs, int tp, int pp, int vp,
                double tokens, double tflops) {
    PublishedRun r = nemo(name, preset, gpus, batch, mbs, 8192, tp, pp, vp, tokens, tflops, 0, tp > 1, pp > 1);
    r.causal_flops_halved = true;
    r.fused_cross_entropy = true;
    return r;
  };
  static const std::vector<PublishedRun> kRows = [&] {
    PublishedRun cp = row("LLAMA3.1_405B", "llama3-405b", 128, 64, 1, 4, 8, 8, 661, 1667);
    cp.cp = 2;
    cp.embedding_loss_in_split = true;
    cp.chunk_buckets = true;
    PublishedRun l8 = row("LLAMA3_8B", "llama3-8b", 8, 128, 2, 1, 1, 1, 30624, 1576);
    l8.bucket_mb = 128 * double(1 << 20) * parallel::kGradElemBytes / 1e6;
    return std::vector<PublishedRun>{l8, cp};
  }();
  return kRows;
}

// Megatron-LM's weak-scaling table (its README since 2024-07-15, f2e5db402c,
// images/model_table.png; the text: vocabulary 131,072, seq 4,096, H100,
// "--overlap-grad-reduce --overlap-param-gather", "--tp-comm-overlap",
// pipeline communication overlapped "by default"): model, heads, hidden,
// layers, TP, PP, GPUs, batch and TFLOP/s per GPU as published (MFU over
// 989 TFLOP/s). TFLOP/s as core_r0.8.0's num_floating_point_operations
// counts them: 12·B·s·l·h²·((1 + 1 + s/h) + 4 + V/2lh), which is
// model_flops_per_token (the causal mask not halved). Run as pretrain_gpt.py
// of core_r0.8.0 (megatron/training/arguments.py) runs a GPT with those
// flags and its defaults:
//  - GPT-3's block (LayerNorm, GeLU MLP of 4h, learned absolute positions,
//    --hidden-dropout and --attention-dropout 0.1), gpt3-175b's preset
//    reshaped; the embedding and the LM head untied
//    (--untie-embeddings-and-output-weights): the table's sizes count both,
//    12·l·h² + 2·V·h + 4096·h is 1.76B, 7.13B, ... 461.5B (tied: 1.49B,
//    6.59B, ...); vocabulary padded to 128 x TP (131,072 already is);
//  - --transformer-impl transformer_engine (the default): TE's fused
//    attention; sequence parallelism with TP (--tp-comm-overlap needs it);
//  - bf16 makes --accumulate-allreduce-grads-in-fp32 true: fp32 main
//    gradients, their accumulation fused (--gradient-accumulation-fusion's
//    default), reduced in fp32;
//  - --use-distributed-optimizer (--overlap-param-gather requires it): the
//    gradients reduce-scattered during backward, the parameters gathered in
//    the next forward (shardlab's --use-distributed-optimizer
//    --overlap-param-gather);
//    DistributedDataParallel's default bucket, max(40M, 1M x dp) parameters
//    = 48M at DP 48, 192 MB of fp32 gradients;
//  - the cross-entropy unfused (--cross-entropy-loss-fusion is off by
//    default): Megatron-core's vocab-parallel one;
//  - no activation recomputation (none is named);
//  - --overlap-p2p-communication's default (True) with a pipeline.
// Not published, and chosen by one rule for every row, not per row: with
// no pipeline the replica's batch (192 / 48 = 4 sequences) as one
// micro-batch (no gradient accumulation, as the 2021 rows without a
// pipeline ran); with a pipeline, micro-batches of 1 (Megatron-LM's GPT-3
// example, examples/gpt3/train_gpt3_175b_distributed.sh, and every
// pipelined row above) on the interleaved schedule with one layer per
// virtual stage (VP = the stage's layers: 42, 23, 16, 12 and 7 here;
// core_r0.8 needs the stage's layers to divide by the chunk's, and 23 and 7
// divide only by 1 and themselves).
// Not modeled: core_r0.8 buckets the gradients only on the first pipeline
// rank's first chunk (the others reduce theirs in one bucket at the end of
// the backward).
namespace {
// A row of Megatron-LM's README run as core_r0.8 ran it (the rules above).
PublishedRun mcore_row(const char* name, int heads, int hidden, int layers, int tp, int pp, int gpus, int batch,
                       double tflops) {
  const int dp = gpus / (tp * pp);
  const int mbs = pp > 1 ? 1 : batch / dp, vp = pp > 1 ? layers / pp : 1;
  const double bucket_mb = 4.0 * std::max(40, dp);  // max(40M, 1M x dp) fp32 gradients
  PublishedRun r = reshaped(nemo(name, "gpt3-175b", gpus, batch, mbs, 4096, tp, pp, vp, 0, tflops, bucket_mb,
                                 tp > 1, pp > 1),
                            layers, hidden, heads);
  r.recipe = Recipe::kMegatronCore2024;
  r.precision = Precision::kBf16;
  r.grad_reduce_bf16 = false;
  r.vocab = 131072;
  r.untied_embeddings = true;
  return r;
}
}  // namespace

const std::vector<PublishedRun>& megatron_core_weak_scaling_h100() {
  const auto row = mcore_row;
  // name, heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU
  static const std::vector<PublishedRun> kRows = {
      row("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),      row("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
      row("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),      row("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
      row("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),      row("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
      row("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),  row("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
      row("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
  };
  return kRows;
}

// The same README's strong scaling: "the standard GPT-3 model (our version
// has slightly more than 175 billion parameters due to larger vocabulary
// size) from 96 H100 GPUs to 4608 GPUs, using the same batch size of 1152
// sequences throughout ... a reduction in MFU from 47% to 42%"
// (images/strong_scaling.png). That model and batch are the weak-scaling
// table's 177B row (96 layers, hidden 12,288, 96 heads, batch 1,152), which
// ran TP 8 x PP 6 on 2,304 GPUs; the endpoints keep its TP and PP (DP 2 and
// 96) and every rule of the rows above. MFU over H100's 989 dense BF16
// TFLOP/s, the table's own ratio (its 1.7B row: 408.8 TFLOP/s is its "41%").
const std::vector<PublishedRun>& megatron_core_strong_scaling_h100() {
  static const std::vector<PublishedRun> kRows = {
      mcore_row("GPT-3 (177B), 96 GPUs", 96, 12288, 96, 8, 6, 96, 1152, 0.47 * 989),
      mcore_row("GPT-3 (177B), 4608 GPUs", 96, 12288, 96, 8, 6, 4608, 1152, 0.42 * 989),
  };
  return kRows;
}

}  // namespace shardlab::train
