// Multi-head latent attention's own kernels (DeepSeek-V2/V3; GPTConfig::is_mla),
// llm.c style like kernels_llama.h: templated on Real, outputs first.
//
// MLA projects every token's hidden state into two small latents, q's and
// k/v's, and up-projects them per head (layers_mla.cc). Its core attention
// is ordinary causal multi-head attention whose queries and keys have
// HS = Dn + Dr features (Dn without position, Dr rotated) and whose values
// have Dv <= HS. The core's kernels (kernels.h attention_*, FusedAttention,
// LocalAttention) take the fused [q | k | v] layout of NH heads of HS each,
// so the values are padded with zeros to HS for the host's math (a zero
// feature of v gives a zero feature of the output, and its gradient is
// dropped); their costs count Dv.
//
// mla_rope: Transformer Engine's fused MLA RoPE kernels
// (fused_apply_mla_rope_for_q and _for_kv, Megatron-core's
// apply_rope_fusion), one kernel each way, from the up-projections' rows
//   q  (N, NH·(Dn + Dr)): per head [q without position | q to rotate]
//   kv (N, NH·(Dn + Dv)): per head [k without position | v]
//   kpe (N, Dr): the key's rotated features, shared by the heads
// to the core's rows [q (NH·HS) | k (NH·HS) | v (NH·HS, zero past Dv)], each
// head's query [q_nope | rope(q_pe)] and key [k_nope | rope(kpe)]. RoPE is
// kernels_llama.h's (rotate-half, angle pos·theta^(-2i/Dr)); Hugging Face's
// DeepSeek-V3 rotates interleaved pairs, the same model up to a fixed
// permutation of the rotated rows of q_b_proj and kv_a_proj_with_mqa.
// The backward WRITES dq, dkv and dkpe (dkpe sums the heads' key gradients).
#pragma once

#include <cstdint>

#include "model/sink.h"
#include "runtime/cost_model.h"

namespace shardlab::model {

struct MlaHeads {
  int NH = 0;  // heads of this rank
  int Dn = 0, Dr = 0, Dv = 0;
  int HS() const { return Dn + Dr; }  // the core's head size (queries and keys; v padded to it)
  int64_t q_width() const { return int64_t{NH} * HS(); }
  int64_t kv_width() const { return int64_t{NH} * (Dn + Dv); }
  int64_t core_width() const { return 3 * int64_t{NH} * HS(); }
};

template <typename Real>
void mla_rope_forward(Real* qkv, const Real* q, const Real* kv, const Real* kpe, const int64_t* positions, int B,
                      int T, const MlaHeads& h, double theta);
template <typename Real>
void mla_rope_backward(Real* dq, Real* dkv, Real* dkpe, const Real* dqkv, const int64_t* positions, int B, int T,
                       const MlaHeads& h, double theta);
// Reads q, kv and kpe, writes q, k and v for the core (v Dv wide); 3 FLOPs a rotated feature.
OpCost mla_rope_forward_cost(int64_t N, const MlaHeads& h, int elem);
// Reads the core's dq, dk, dv, writes dq, dkv and dkpe.
OpCost mla_rope_backward_cost(int64_t N, const MlaHeads& h, int elem);

// Inference (model/infer, the latent KV cache): rotates in place each of
// the T rows' query heads' last Dr features (q: NH·HS a row, row stride ldq)
// and their rotated keys (kpe: Dr, row stride ldk) at `positions`, as
// mla_rope_forward rotates them (without laying out the core's rows).
void mla_rope_inplace(float* q, int64_t ldq, float* kpe, int64_t ldk, const int64_t* positions, int T,
                      const MlaHeads& h, double theta);
// Reads and writes the rotated features: 3 FLOPs each.
OpCost mla_rope_inplace_cost(int64_t N, const MlaHeads& h, int elem);

// Host copies between the core's padded output rows (N, NH·HS) and o_proj's
// input (N, NH·Dv): views and slices on a GPU, charged nothing. pad writes
// the zeros too.
template <typename Real>
void mla_unpad(Real* out, const Real* padded, int64_t N, const MlaHeads& h);
template <typename Real>
void mla_pad(Real* padded, const Real* in, int64_t N, const MlaHeads& h);
// Rows of a + b columns split into two buffers, and back (torch.split / cat of a
// GEMM's output: views on a GPU, charged nothing).
template <typename Real>
void split_columns(Real* left, Real* right, const Real* in, int64_t N, int a, int b);
template <typename Real>
void join_columns(Real* out, const Real* left, const Real* right, int64_t N, int a, int b);

template <typename Real>
void mla_rope_forward(const Exec& ex, const char* name, Real* qkv, const Real* q, const Real* kv, const Real* kpe,
                      const int64_t* positions, int B, int T, const MlaHeads& h, double theta) {
  ex.run(name, mla_rope_forward_cost(int64_t{B} * T, h, ex.elem),
         [&] { mla_rope_forward(qkv, q, kv, kpe, positions, B, T, h, theta); });
}
template <typename Real>
void mla_rope_backward(const Exec& ex, const char* name, Real* dq, Real* dkv, Real* dkpe, const Real* dqkv,
                       const int64_t* positions, int B, int T, const MlaHeads& h, double theta) {
  ex.run(name, mla_rope_backward_cost(int64_t{B} * T, h, ex.elem),
         [&] { mla_rope_backward(dq, dkv, dkpe, dqkv, positions, B, T, h, theta); });
}

}  // namespace shardlab::model
