// The transformer block on one rank, composing the parallelisms: tensor
// parallelism's regions (tensor/mappings.h) around the attention core
// (attention_core.h: LocalAttention, or context/'s CpAttention) and around
// the MLP (shard_layers.h) or the MoE layer (expert/: TP-split experts, or
// expert parallelism's all-to-all dispatch).
//
//   attention: ln_1 -> [enter] c_attn column-parallel (this rank's heads)
//              -> the attention core over the local heads
//              -> c_proj row-parallel (partial sums) -> [exit] -> + bias (once)
//   MLP:       ln_2 -> [enter] c_fc column-parallel -> GELU
//              -> c_proj row-parallel -> [exit] -> + bias
//   llama:     RMSNorms (weight only); c_attn the fused q|k|v projection (K/V
//              by K/V heads, or replicated when tp does not divide them:
//              their gradients are then partial and summed over TP by
//              ShardedGPT::finish_block) -> RoPE at global positions ->
//              repeat_kv; the MLP's c_fc the fused gate|up -> SwiGLU; no biases.
//   MoE:       ln_2 -> [enter] router (replicated, on the full rows)
//              -> dispatch -> each expert's MLP split like the dense one
//              -> all-reduce of the expert outputs
//              -> + expert biases -> combine -> scatter to SP rows
//
// [enter] / [exit] are the mode's region boundaries (tensor/mappings.h): without
// SP copy_to / reduce_from (all-reduce); with SP all-gather / reduce-scatter,
// and the LayerNorm / residual regions hold only this rank's Nr = N/tp rows.
// With SP the gathered LayerNorm outputs are not kept: backward gathers them
// again (Megatron does the same to keep activation memory at 1/tp).
//
// This is the one file that knows every parallelism of a block: tensor/,
// expert/ and context/ do not include one another. A new kind of block
// (another norm, a gated MLP, grouped-query attention, rotary positions)
// changes the wiring here and adds its kernels and sharding below it.
//
// Size letters as in dims.h.
// Backward accumulates into dinp and the gradient views, like model/layers.h.
// Thread safety: called from the device's own thread, like the collectives.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/parallel/attention_core.h"
#include "model/parallel/dims.h"
#include "model/parallel/expert/moe.h"
#include "model/parallel/recompute.h"
#include "model/parallel/shard_layers.h"
#include "model/parallel/tensor/mappings.h"
#include "model/parallel/weight_grad.h"

namespace shardlab::parallel {

// What a block needs besides its weights: each parallelism's context and
// the block's own options. Both contexts run on the same device and charge
// the same Exec (set_exec keeps them equal).
struct BlockContext {
  TpContext tp;        // the TP group and mode
  ExpertContext moe;   // the MoE layers' groups (its tp: the same TP group)
  // The attention core of every block; null: LocalAttention.
  const AttentionCore* attention = nullptr;
  bool dropout = false;  // charge attention and hidden dropout (GPTConfig::dropout > 0)

  const model::Exec& ex() const { return tp.ex; }
  void set_exec(const model::Exec& ex) { tp.ex = moe.ex = ex; }
  const AttentionCore& attention_core() const;
};

// MLA's activations on one TP rank (block_mla.cc; GPTConfig::is_mla): the
// latents of this rank's Nr rows (held whole by every rank: each TP rank
// computes the down-projections of its own rows, Megatron-core's duplicated
// linears), before and after their norms, and the key's rotated features.
struct MlaShardActs {
  Buf<float> cq, cq_n, cq_rstd;     // (Nr,Lq), (Nr,Lq), (Nr); none without q's latent
  Buf<float> ckv, ckv_n, ckv_rstd;  // (Nr,Lkv), (Nr,Lkv), (Nr)
  Buf<float> kpe;                   // (Nr,Dr) before RoPE
  void resize(int64_t Nr, const model::GPTConfig& config);
  int64_t saved_elements(bool fp8) const;
};

// MLA's scratch: the gathered latents (N rows), the up-projections' outputs
// and gradients, the core's padded output (v to HS), the latents' gradients.
struct MlaShardScratch {
  Buf<float> cq_full, ckv_full, kpe_full;  // (N,Lq), (N,Lkv), (N,Dr)
  Buf<float> q, kv;                        // (N,NHl·HS), (N,NHl·(Dn + Dv))
  Buf<float> down;                         // (Nr,Lkv + Dr) kv_a_proj_with_mqa's output; its gradient
  Buf<float> atty_pad, datty_pad;          // (N,Cl) the core's output and its gradient, v padded to HS
  Buf<float> dlat_full, dkpe_full;         // (N,max(Lq,Lkv)), (N,Dr) partial over TP
  Buf<float> dlat, dlat_in, dkpe;          // (Nr,max(Lq,Lkv)) after the reduction and before the norm, (Nr,Dr)
  Buf<float> dhidden;                      // (N,C) q_proj's partial input gradient (no q latent)
  void resize(const ShardDims& d, const model::GPTConfig& config);
};

// The activations a block keeps from its forward to its backward.
struct BlockActs {
  Buf<float> ln1, ln2;                      // (Nr,C)
  Buf<float> ln1_mean, ln1_rstd;            // (Nr)
  Buf<float> ln2_mean, ln2_rstd;            // (Nr)
  Buf<float> qkv;                           // (N,3Cl) local heads' [q | k | v]; llama (N,qkv_width), rotated
  Buf<float> att;                           // ShardDims::att_elements()
  Buf<float> atty;                          // (N,Cl); MLA (N,Cv): the values' heads
  MlaShardActs mla;                         // MLA; qkv then holds the core's [q | k | v] (N,3Cl), v padded
  Buf<float> qk_pre, qk_rstd;               // llama QK-norm: local q and k heads before it, rstd per head
  Buf<float> attproj, res1, mlp_out, res2;  // (Nr,C)
  Buf<float> fc, fc_gelu;                   // (N,Fl) dense blocks
  TpMoeActs moe;                            // MoE blocks
  int64_t v_pad = 0;                        // MLA: qkv's elements padding v to HS (host only, not kept)
  void resize(const ShardDims& d, const model::GPTConfig& config, bool moe_block);
  // What the block keeps for backward, in modeled elements. fp8 (a
  // Precision::kFp8 run): the inputs of the FP8 GEMMs (ln1, ln2, atty,
  // fc_gelu) are kept as Transformer Engine keeps them, in FP8, 1 B of the
  // 2 B element, so each counts half (rounded up).
  int64_t saved_elements(bool fp8 = false) const;
};

// Scratch shared by all blocks, overwritten by each call.
struct BlockScratch {
  Buf<float> full_in, full_dout, partial, rep, moe_out;  // (N,C)
  Buf<float> dres1, dln;                                 // (Nr,C)
  Buf<float> datty;                                      // (N,Cl)
  Buf<float> dqkv;                                       // (N,3Cl)
  Buf<float> qkv_rep, dqkv_c;  // llama GQA: (N,3Cl) K/V repeated for the core, (N,qkv_width) its gradient
  std::vector<int64_t> positions;  // (T) the global position of each local time (RoPE)
  Buf<float> dfc, dfc_gelu;                              // (N,Fl) dense blocks
  MoeScratch moe;                                        // MoE blocks
  MlaShardScratch mla;                                   // MLA
  void resize(const ShardDims& d, const model::GPTConfig& config);
};

// The [q | k | v] rows the attention core reads: a.qkv, or for a llama
// block with GQA its K/V heads repeated into s.qkv_rep (charged).
const float* core_qkv(const BlockActs& a, BlockScratch& s, const ShardDims& d, const model::GPTConfig& config,
                      const BlockContext& c);

// Multi-head latent attention on one TP rank (block_mla.cc), Megatron-core's
// MLASelfAttention: ln_1's rows (Nr) -> the duplicated down-projections and
// the latents' norms on this rank's rows -> [enter] each latent (with SP:
// all-gathered, q's, k/v's and the rotated key apart) -> the up-projections
// column-parallel (this rank's heads) -> the fused MLA RoPE -> the core ->
// o_proj row-parallel -> [exit]. out (Nr,C). Backward: dln (Nr,C) is
// written complete (the latents' gradients reduced over TP before their
// norms: no reduction of the hidden state's gradient).
void mla_attention_forward(float* out, BlockActs& a, const model::BlockView<float>& p, const float* ln1,
                           const ShardDims& d, const model::GPTConfig& config, BlockScratch& s,
                           const BlockContext& c);
void mla_attention_backward(float* dln, const model::BlockView<float>& g, BlockScratch& s, const float* dout_full,
                            const float* ln1, const BlockActs& a, const model::BlockView<float>& p,
                            const ShardDims& d, const model::GPTConfig& config, WeightGrads& wg,
                            const BlockContext& c);
// The up-projections and RoPE from the kept latents (and ln_1's rows for
// q_proj): a.qkv (selective recomputation of mla_up_proj; the forward's part).
void mla_up_forward(BlockActs& a, const model::BlockView<float>& p, const float* ln1, const ShardDims& d,
                    const model::GPTConfig& config, BlockScratch& s, const BlockContext& c);
// The core alone on a.qkv (selective recomputation of core_attn): a.atty, a.att.
void mla_core_forward(BlockActs& a, const ShardDims& d, const model::GPTConfig& config, BlockScratch& s,
                      const BlockContext& c);

// The attention core's dropout on its probabilities (unfused cores: the
// fused kernel drops inside), charged when the model has dropout.
void attention_dropout_forward(const ShardDims& d, const BlockContext& c);
void attention_dropout_backward(const ShardDims& d, const BlockContext& c);

// x (Nr,C) -> a.res2 (Nr,C). Returns the block's aux loss (0 if dense).
float block_forward(BlockActs& a, const model::BlockView<float>& p, const float* x,
                    const ShardDims& d, const model::GPTConfig& config, BlockScratch& s,
                    const BlockContext& c);
// What a block keeps for backward when Recompute::kSelective re-runs
// `modules` (RecomputeModule), in modeled elements (saved_elements less the
// modules' own activations); moe_block: an MoE layer.
int64_t selective_kept_elements(const BlockActs& a, const ShardDims& d, const model::GPTConfig& config,
                                bool moe_block, unsigned modules, bool fp8);
// Before the block's backward, re-runs the modules selective_kept_elements
// left out, from what the block kept, writing the same values the forward
// wrote (collectives and MoE exchanges included); charged as "<kernel>.recompute"
// when c's Exec says recompute.
void block_recompute(BlockActs& a, const model::BlockView<float>& p, const ShardDims& d,
                     const model::GPTConfig& config, BlockScratch& s, const BlockContext& c, unsigned modules);
// dinp (Nr,C) += d block / d x given dout (Nr,C); gradients into g.
void block_backward(float* dinp, const model::BlockView<float>& g, BlockScratch& s,
                    const float* dout, float daux, const BlockActs& a, const float* inp,
                    const model::BlockView<float>& p, const ShardDims& d,
                    const model::GPTConfig& config, WeightGrads& wg, const BlockContext& c);

}  // namespace shardlab::parallel
