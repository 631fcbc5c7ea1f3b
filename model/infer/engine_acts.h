// The activations of one InferEngine step (internal to engine*.cc). Nothing
// is kept for a backward pass: every block overwrites the same buffers.
// Size letters: N new tokens of the step, C, Cl local heads' width, Fl = F/tp;
// MLA's Lq, Lkv latents and Dr rotated features (model/kernels_mla.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/infer/engine.h"

namespace shardlab::infer {

struct InferEngine::Acts {
  parallel::Buf<float> x;             // (N,C) the residual stream
  parallel::Buf<float> ln, res1;      // (N,C)
  parallel::Buf<float> mean, rstd;    // (N)
  parallel::Buf<float> qkv;           // (N,3Cl)
  parallel::Buf<float> atty;          // (N,Cl)
  parallel::Buf<float> qk_pre, qk_rstd;  // llama QK-norm's scratch: the local q and k heads, rstd per head
  parallel::Buf<float> mla_cq, mla_cq_n;    // MLA: q's latent (N,Lq), normalized
  parallel::Buf<float> mla_down;            // (N,Lkv+Dr) kv_a_proj_with_mqa's rows
  parallel::Buf<float> mla_ckv, mla_ckv_n;  // (N,Lkv) k/v's latent, normalized
  parallel::Buf<float> mla_kpe;             // (N,Dr) the shared key to rotate
  parallel::Buf<float> partial, out;  // (N,C) row-parallel partial sums, block outputs
  parallel::Buf<float> fc, fc_gelu;   // (N,Fl) dense blocks
  std::vector<int64_t> positions;     // (N) each new row's position in its sequence (RoPE)
  parallel::TpMoeActs moe;            // MoE blocks (routing, expert rows)
  parallel::MoeScratch scratch;       // MoE under EP: the received rows
  int64_t elements() const {
    int64_t n = 0;
    for (const parallel::Buf<float>* b : {&x, &ln, &res1, &mean, &rstd, &qkv, &atty, &qk_pre, &qk_rstd, &mla_cq,
                                            &mla_cq_n, &mla_down, &mla_ckv, &mla_ckv_n, &mla_kpe, &partial, &out, &fc,
                                            &fc_gelu})
      n += int64_t(b->size());
    return n;
  }
};

}  // namespace shardlab::infer
