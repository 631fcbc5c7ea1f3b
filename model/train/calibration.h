// The published runs the cost model is checked against, each run as the
// code of its time ran it.
//
// The fit: Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM" (SC'21), Table 1: GPT models
// of 1.7B to 1T parameters on Selene (DGX A100 80 GB, 8 GPUs per node on
// NVSwitch, 8 x 200 Gb/s HDR InfiniBand per node), vocabulary 51200,
// sequence 2048, full activation recomputation; achieved teraFLOP/s per GPU
// counted as 96·B·s·l·h²·(1 + s/6h + V/16lh) per step (the paper's Eq. 3).
// The table gives model, TP, PP, GPUs and batch; the micro-batch size, the
// schedule and the data-parallel implementation are those of NVIDIA's own
// script for it (NVIDIA/Megatron-LM examples/sc21/run_table_1.sh, commit
// de7dc40f88): MBS 16, 16, 16, 8, 4, 2, 2, 1, 1, 1; interleaved with 5, 5, 3
// and 1 layers per virtual stage for 76B, 145B, 310B and 530B (3, 2, 2 and 3
// chunks per rank), 1F1B for 39B and 1T; torch DDP (the gradient all-reduce
// overlapped with backward) without a pipeline, local DDP (after the flush)
// with one.
//
// Held out of the fit, run the same way (tests/model/train/heldout_test.cc):
//   Narayanan et al. 2021 Table 2, PTD parallelism (the rows as
//     cli99/llm-analysis examples/megatron-lm/run_train.sh transcribes
//     them): GPT-3 175B (174.6B with the vocabulary 51200, batch 1536, TP 8
//     x PP 12) on 384, 768 and 1,536 GPUs and 529.6B (batch 2240, TP 8 x PP
//     35) on 560, 1,120 and 2,240;
//     micro-batch 1, interleaved as the sc21 scripts run these shapes (175B
//     on TP 8 x PP 12: 2 layers per virtual stage, run_figure_12.sh and
//     run_figure_18.sh; 530B: 1, run_table_1.sh).
//   Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
//     Transformer Models" (MLSys'23), Table 5: end-to-end iteration times of
//     22B, 175B, 530B and 1T on 8 to 512 A100s (data-parallel size 1) with
//     full recomputation and with "present work" (sequence parallelism and
//     selective recomputation); the configurations of its Table 3 as
//     Calculon's validation of this table runs them
//     (calculon-ai/calculon validation/seqsel/tab5/*.json: micro-batch 4 for
//     22B, else 1; 3 chunks per rank for 175B and 530B, 1F1B for 1T; its
//     calculon/llm/validation.py transcribes the times). The
//     Megatron-LM README's MFU/HFU table (41.5, 51.4, 56.0 and 56.3% MFU) is
//     the same "present work" runs.
//
// Every run as its code ran it: attention and hidden dropout 0.1 (their
// kernels charged); no ZeRO; without sequence parallelism (2021's code, and
// 2022's full-recompute runs) LayerNorm and dropout replicated on the TP
// ranks, TP all-reduces, and the scatter/gather of activations between
// stages (each TP rank sends 1/t of them, an all-gather over NVLink
// reassembles them, Narayanan et al. 2021 §4.1); with it (2022's "present
// work"), the sequence-parallel collectives and selective recomputation.
// The sc21 scripts run fp16 with a static loss scale, shardlab bf16 (the
// same tensor-core rate on A100). The 2021 rows keep their gradients in fp16
// as that code did without --accumulate-allreduce-grads-in-fp32
// (ParallelOptions::half_grads: autograd's fp16 accumulation, fp16 on the
// wire, DDP's copies, the fp16 optimizer's copy/unscale/copy-back passes);
// the 2022 rows fuse the accumulation into fp32 main gradients. Both compute
// the loss as Megatron-LM's vocab_parallel_cross_entropy did, on the logits
// cast to fp32, in unfused kernels (ParallelOptions::fusions.cross_entropy off).
#pragma once

#include <string>
#include <vector>

#include "model/train/trainer.h"
#include "runtime/profile.h"

namespace shardlab::train {

// How a published run's code ran it. kMegatron2021: the header's 2021-2022
// Megatron-LM recipe. kNeMo2024: NeMo 24.07 / Megatron-core with Transformer
// Engine (nemo_run_options says what that is). kMegatronCore2024:
// Megatron-LM's own pretrain_gpt.py on Megatron-core r0.8 (mid-2024,
// megatron_core_weak_scaling_h100), run like kNeMo2024 with that code's
// defaults, which the rows carry in their fields.
enum class Recipe : uint8_t { kMegatron2021, kNeMo2024, kMegatronCore2024 };

struct PublishedRun {
  std::string preset;  // model::preset name (megatron-1.7b ...)
  int tp = 1, pp = 1, gpus = 1;
  double tflops_per_gpu = 0;  // published, per GPU, recompute counted (Eq. 3); 0 with iteration_s
  // The configuration where the source gives it; 0: shardlab's defaults.
  int batch = 0;             // global batch in sequences (0: the preset's)
  int micro_batch_size = 0;  // 0: 1 with a pipeline, B/dp without
  int vpp = 0;  // chunks per pipeline rank: 1 = 1F1B; 0: 2 (3 when a stage's layers are odd)
  bool overlap = false;  // the gradient all-reduce overlapped with backward (torch DDP)
  // Korthikanti et al. 2022's runs.
  bool sp_selective = false;  // sequence parallelism + selective recompute; else full, no SP
  int layers = 0, heads = 0;  // the shape, where it is not the preset's (0: the preset's)
  double iteration_s = 0;     // published iteration time (s), when the source gives that
  // Megatron-LM's --gradient-accumulation-fusion (2022 on). Off: a 2021 row,
  // run with half-precision gradients (ParallelOptions::half_grads).
  bool grad_accum_fusion = false;
  // The rows of 2024 (nemo2407_h100_fp8, dubey2024_table4): run as NeMo
  // 24.07 / Megatron-core run them (nemo_run_options), not as the 2021 code.
  Recipe recipe = Recipe::kMegatron2021;
  int seq = 0;                   // sequence length (0: 2048)
  int cp = 1;                    // context parallelism
  Precision precision = Precision::kBf16;  // the GEMMs' (kFp8: Transformer Engine's FP8 recipe)
  double tokens_per_gpu_s = 0;   // published tokens/s per GPU (0: not published)
  double bucket_mb = 0;          // the launcher's bucket_cap_mb (0: shardlab's default)
  const char* name = "";         // the source's model name ("GPT3-5B"); "" for the 2021-2022 rows
  int embd = 0;                  // the width, where it is not the preset's (0: the preset's)
  // What the 2024 rows' configs set (nemo_run_options applies them):
  // ub_tp_comm_overlap (ParallelOptions::tp_comm_overlap) and, with a
  // pipeline, overlap_p2p_comm (ParallelOptions::overlap_p2p_comm).
  bool tp_comm_overlap = false;
  bool overlap_p2p_comm = false;
  int zero = 0;  // kNeMo2024: the optimizer's sharding (0: Megatron's distributed optimizer, ParallelOptions::distributed_optimizer; 3: FSDP)
  // The source counts the causal attention's scores and context at half
  // (12·l·h·s/2 per token), as Megatron-Bridge's tables do from 25.09 on.
  bool causal_flops_halved = false;
  // kNeMo2024: the recipe fuses the cross-entropy (cross_entropy_loss_fusion,
  // Megatron-Bridge's recipes); else Megatron-core's unfused vocab-parallel one.
  bool fused_cross_entropy = false;
  // The embedding and the loss each take one layer's slot in the pipeline
  // split (ParallelOptions::stage_layers): the blocks split evenly over
  // n_layer + 2 slots, then the first and the last virtual stage hold one
  // block fewer. Megatron-core's account_for_embedding_in_pipeline_split and
  // account_for_loss_in_pipeline_split (Megatron-Bridge's Llama 3.1 405B
  // recipe); with one block per chunk it is Llama 3's pipeline (Dubey et
  // al. 2024, sec. 3.3.2): the first virtual stage holds only the
  // embedding, the last only the head and the loss.
  bool embedding_loss_in_split = false;
  // kNeMo2024: the gradients kept and reduced in bf16 (NeMo 24.07's
  // +optim.grad_sync_dtype=bf16, Megatron-Bridge's grad_reduce_in_fp32 =
  // False; ParallelOptions::grad_reduce_bf16); Dubey et al. reduce in fp32.
  bool grad_reduce_bf16 = false;
  // Device memory for the run (GiB; 0: the profile's), where the source fits
  // what shardlab's accounting does not (Llama 3 frees each stage's inputs
  // and outputs early, sec. 3.3.2: not modeled): time only, the peak is reported.
  double memory_gib = 0;
  // kNeMo2024: one data-parallel bucket per model chunk
  // (ParallelOptions::chunk_buckets), as Megatron-Bridge's interleaved rows
  // with dp > 1 run (calibration.cc megatron_bridge2511_h100_fp8).
  bool chunk_buckets = false;
  int vocab = 0;  // the tokenizer's vocabulary, where it is not the preset's (0: the preset's)
  // The fused attention kernel the source's software ran, by the profile's
  // name for it (select_attention_kernel; "": the profile's default, cuDNN's
  // on H100): NeMo-Framework-Launcher 24.01-24.07 set NVTE_FUSED_ATTN=0 for
  // every run, which sends Transformer Engine to FlashAttention-2 ("fa2").
  const char* attention_kernel = "";
  bool untied_embeddings = false;  // Megatron's --untie-embeddings-and-output-weights (a GPT preset ties them)
};

// The ten rows of Table 1, as published, with run_table_1.sh's configuration.
const std::vector<PublishedRun>& narayanan2021_table1();
// The held-out PTD-parallelism rows of Table 2 (175B and 530B), as published.
const std::vector<PublishedRun>& narayanan2021_table2();
// The held-out rows of Korthikanti et al. 2022 Table 5: per model, full
// recomputation, then sequence parallelism + selective recomputation.
const std::vector<PublishedRun>& korthikanti2022_table5();

// NVIDIA's NeMo 24.07 pretraining figures on DGX-H100 in FP8 (issue 30): six
// rows, GPT-3 5B to 175B and Llama 2 7B and 70B, published as tokens/s and
// model TFLOP/s per GPU (calibration.cc says where each setting comes from).
const std::vector<PublishedRun>& nemo2407_h100_fp8();
// The same 24.07 summary's other Llama rows, held out of every fit:
// LLAMA2-13B (16 GPUs, PP 4), LLAMA3-8B (8 GPUs, CP 2) and LLAMA3-70B (64
// GPUs, TP 4, PP 4, CP 2), each run as its launcher config sets it.
const std::vector<PublishedRun>& nemo2407_h100_fp8_heldout();
// NeMo's long-sequence table (NeMo 24.03.01 container, DGX-H100, FP8): Llama
// 2 7B at 4K to 1M tokens a sequence on 4 to 1,024 GPUs, context
// parallelism from 32K; held out of every fit (calibration_tables.cc).
const std::vector<PublishedRun>& nemo2403_h100_fp8_long_sequence();
// Dubey et al. 2024 ("The Llama 3 Herd of Models"), Table 4: Llama 3 405B on
// 8,192 and 16,384 H100s in BF16 (TP 8, PP 16; the third with CP 16 at seq
// 131,072), as sec. 3.3.2 describes the runs (calibration.cc). H100's bf16
// GEMM maximum is fitted to these three rows (tests/model/train/h100_calibration_test.cc).
const std::vector<PublishedRun>& dubey2024_table4();
// NVIDIA's Megatron-Bridge pretraining figures on DGX-H100 in FP8 (current
// scaling), NeMo 25.11 container: Llama 3 8B (8 GPUs, FSDP), Llama 3 70B (64
// GPUs, TP 4, PP 8, VP 5) and Llama 3.1 405B (1,024 GPUs, TP 8, PP 8, CP 2,
// VP 8); held out of every fit (tests/model/train/h100_calibration_test.cc
// runs the first two; the 405B row's phantom step runs 1,024 unfolded
// threads: bench_phantom --table bridge).
const std::vector<PublishedRun>& megatron_bridge2511_h100_fp8();
// The same summary's 26.04.01 DGX-H100 rows of Llama 3 70B (GBS 256) and
// Llama 3.1 405B (GBS 1,536): the 25.11 recipes with a larger global batch
// (calibration_tables.cc); held out of every fit (bench_phantom --table
// bridge-2604; tests/model/train/h100_calibration_test.cc).
const std::vector<PublishedRun>& megatron_bridge2604_h100_fp8();
// The same summary's DGX-B200 rows (25.11, FP8 with current scaling): Llama
// 3 8B (8 GPUs, MBS 2, DDP with the distributed optimizer) and Llama 3.1
// 405B (128 GPUs, TP 4, PP 8, CP 2, VP 8, GBS 64), each run as its recipe
// sets it (calibration.cc). b200-nvlink's FP8 GEMM maximum is fitted to
// these two rows (runtime/profile_builtin.cc kB200Fp8GemmMax);
// tests/model/train/h100_calibration_test.cc runs both (the 405B row's cp
// ranks do not fold: 128 device threads, ~10 s of wall time), and so does
// bench_phantom --table bridge-b200, with wall time and threads.
// No BF16 B200 row of a dense model is published (25.09's DGX-B200 table,
// without a precision column, holds the same FP8 runs: its parenthesized
// figures are MXFP8's, as its footnote says).
const std::vector<PublishedRun>& megatron_bridge2511_b200();

// Megatron-LM's weak-scaling table (NVIDIA/Megatron-LM README, "Training
// Speed and Scalability", images/model_table.png, added 2024-07-15 with
// f2e5db402c, in core_r0.8.0): nine GPT models of 1.7B to 462B on up to
// 6,144 H100s in BF16, vocabulary 131,072, seq 4,096, DP 48, published as
// TFLOP/s per GPU; held out of every fit (calibration.cc says how they run).
const std::vector<PublishedRun>& megatron_core_weak_scaling_h100();

// The same README's strong scaling of its GPT-3 (the 177B row: batch 1,152,
// TP 8 x PP 6) from 96 to 4,608 H100s, MFU 47% to 42%: the two endpoints,
// held out of every fit (calibration_tables.cc).
const std::vector<PublishedRun>& megatron_core_strong_scaling_h100();

// Model FLOPs per token as NeMo and Megatron count them (no recomputation):
// 3 x the forward's matmuls, 6·(the blocks' linear weights) + 6·V·h (the LM
// head) + 12·l·h·s (scores and context, the causal mask not halved). For
// GPT-3 it is Eq. 3 without recomputation, 72·l·h²·(1 + s/6h + V/12lh).
// causal_halved: the scores and context at half, 6·l·h·s (Megatron-Bridge).
double model_flops_per_token(const model::GPTConfig& c, bool causal_halved = false);

// Whether `r` is run as Megatron-core runs it (nemo_run_options).
inline bool megatron_core_recipe(Recipe r) { return r != Recipe::kMegatron2021; }

// The training options shardlab runs for a row (phantom, one step, bf16 is
// the cluster's precision, vocabulary 51200), as the header describes.
TrainOptions published_run_options(const PublishedRun& row);

// The paper's FLOPs per step (Eq. 3) for `options`' model and batch.
double paper_flops_per_step(const TrainOptions& options);

struct PredictedRun {
  PublishedRun row;
  TrainOptions options;
  double step_s = 0;          // virtual step time
  double tflops_per_gpu = 0;  // paper_flops_per_step (2024 recipes: model_flops_per_token) / step_s / gpus
  double tokens_per_gpu_s = 0;  // batch · seq / step_s / gpus
  // predicted / published throughput - 1 (TFLOP/s, or published / predicted
  // iteration time): negative when shardlab is slower than the cluster.
  double error = 0;
  int running_devices = 0;    // threads (folding)
  double wall_s = 0;          // host seconds of the phantom step
};

// Runs `row` in phantom on `profile` (its nodes set to fit the row); `fold`
// false: every rank on a thread (TrainOptions::fold; the same figures).
// `trace_path` non-empty: the run's Chrome trace is written there (every
// running device's kernels, collectives and transfers; bench_phantom --trace).
PredictedRun predict(const PublishedRun& row, const HardwareProfile& profile, bool fold = true,
                     const std::string& trace_path = {});

// README's row for a prediction (tests/model/train/calibration_test.cc and
// heldout_test.cc pin README's tables with it). A row published in TFLOP/s:
// model (parameters in billions), TP, PP, GPUs, batch, predicted and
// published TFLOP/s per GPU, error, e.g.
//   | 1.7B | 1 | 1 | 32 | 512 | 138.0 | 137 | +0.7% |
// A row published as an iteration time: model, TP, PP, GPUs, batch,
// recomputation, predicted and published seconds, error, e.g.
//   | 22.1B | 8 | 1 | 8 | 4 | full | 1.47 | 1.42 | -3.2% |
// A 2024 row (Recipe::kNeMo2024 or kMegatronCore2024): the source's name, GPUs, TP, PP, VP, GBS,
// predicted and published tokens/s per GPU, predicted and published model
// TFLOP/s per GPU, error (of the tokens/s where published), e.g.
//   | GPT3-5B | 64 | 1 | 1 | 1 | 2048 | 27065 | 22521 | 883 | 736 | +20.2% |
std::string readme_row(const PredictedRun& r);
// README's line under a table: "Mean |error| 2.7%, max 6.2%." (nan if an
// error is NaN: std::max would drop it).
std::string readme_summary(const std::vector<PredictedRun>& rows);

}  // namespace shardlab::train
