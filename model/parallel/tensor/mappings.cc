#include "model/parallel/tensor/mappings.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace shardlab::parallel {

namespace coll = collectives;

void copy_to_tp_region_bwd(const TpContext& c, const float* partial, float* out, int64_t n) {
  coll::all_reduce(*c.dev, *c.group, coll::ConstBuffer(partial, static_cast<size_t>(n)),
                   coll::Buffer(out, static_cast<size_t>(n)), coll::ReduceOp::kSum, c.on_compute());
}

void reduce_from_tp_region_fwd(const TpContext& c, const float* partial, float* out, int64_t n) {
  coll::all_reduce(*c.dev, *c.group, coll::ConstBuffer(partial, static_cast<size_t>(n)),
                   coll::Buffer(out, static_cast<size_t>(n)), coll::ReduceOp::kSum, c.on_compute());
}

void gather_from_sequence_parallel_fwd(const TpContext& c, const float* local, float* full,
                                       int64_t n_local) {
  coll::all_gather(*c.dev, *c.group, coll::ConstBuffer(local, static_cast<size_t>(n_local)),
                   coll::Buffer(full, static_cast<size_t>(n_local * c.tp())), c.on_compute());
}

void gather_from_sequence_parallel_bwd(const TpContext& c, float* dfull, float* dlocal,
                                       int64_t n_local) {
  coll::reduce_scatter(*c.dev, *c.group,
                       coll::ConstBuffer(dfull, static_cast<size_t>(n_local * c.tp())),
                       coll::Buffer(dlocal, static_cast<size_t>(n_local)), coll::ReduceOp::kSum,
                       c.on_compute());
}

void reduce_scatter_to_sequence_parallel_fwd(const TpContext& c, float* partial, float* local,
                                             int64_t n_local) {
  gather_from_sequence_parallel_bwd(c, partial, local, n_local);
}

void reduce_scatter_to_sequence_parallel_bwd(const TpContext& c, const float* dlocal, float* dfull,
                                             int64_t n_local) {
  gather_from_sequence_parallel_fwd(c, dlocal, dfull, n_local);
}

void scatter_to_sequence_parallel_fwd(const TpContext& c, const float* full, float* local,
                                      int64_t n_local) {
  c.ex.run("sp.scatter.fwd", OpCost{0, 2.0 * static_cast<double>(n_local) * c.ex.elem}, [&] {
    const float* mine = full + c.rank() * n_local;
    std::copy(mine, mine + n_local, local);
  });
}

const float* enter_column_parallel(const TpContext& c, const float* local, float* full,
                                   int64_t rows_local, int width) {
  if (!c.sp) return local;  // copy_to_tp_region_fwd: identity
  gather_from_sequence_parallel_fwd(c, local, full, rows_local * width);
  return full;
}

void enter_column_parallel_bwd(const TpContext& c, float* dfull, float* dlocal, int64_t rows_local,
                               int width) {
  const int64_t n = rows_local * width;  // SP: reduce-scatter; TP: all-reduce
  c.sp ? gather_from_sequence_parallel_bwd(c, dfull, dlocal, n) : copy_to_tp_region_bwd(c, dfull, dlocal, n);
}

void exit_row_parallel(const TpContext& c, float* partial, float* out, int64_t rows_local,
                       int width) {
  const int64_t n = rows_local * width;  // SP: reduce-scatter; TP: all-reduce
  c.sp ? reduce_scatter_to_sequence_parallel_fwd(c, partial, out, n) : reduce_from_tp_region_fwd(c, partial, out, n);
}

const float* exit_row_parallel_bwd(const TpContext& c, const float* dlocal, float* dfull,
                                   int64_t rows_local, int width) {
  if (!c.sp) return dlocal;  // reduce_from_tp_region_bwd: identity
  reduce_scatter_to_sequence_parallel_bwd(c, dlocal, dfull, rows_local * width);
  return dfull;
}

// ---- Communication overlap ------------------------------------------------------

bool tp_overlapping(const TpContext& c) { return c.sp && c.overlap && c.tp() > 1 && c.ex.sink; }

namespace {

// A collective on the side stream, not before `after`; `sms` held
// (note_collective). The overlapped forms call the non-blocking collectives
// (the data are complete on return): the compute stream waits only where the
// pipeline says.
coll::CollOptions on_side(const TpContext& c, Time after, int sms) {
  coll::CollOptions o;
  o.stream = c.overlap;
  o.after = Event{after};
  o.sm_blocks = sms;
  return o;
}

// What a GEMM of `length` on all SMs takes on sm_count - sms of them over
// `overlap` of its length: the extra time.
Time sm_margin(const Device& dev, Time length, Time overlap, int sms) {
  const int64_t all = dev.profile().device.gemm.sm_count;
  if (all <= sms || length <= 0 || overlap <= 0) return 0;
  return static_cast<Time>(std::ceil(double(std::min(length, overlap)) * double(sms) / double(all - sms)));
}

// The gather of a Transformer Engine linear's GEMM input under sequence
// parallelism (a column-parallel layer's LayerNorm output, a row-parallel
// layer's output gradient, and their re-gathers for wgrad). Under
// --precision fp8 TE gathers it already in FP8: the LayerNorm kernel writes
// FP8 (layernorm_fwd_fp8) and the output gradient is cast before its gather
// (layernorm_linear.py / linear.py, `gather_along_first_dim` on the FP8
// tensor; userbuffers' buffers are FP8 too), so 1 B per element crosses the
// links, not the activation precision's 2. Without SP: no gather.
coll::CollOptions gemm_input_wire(const TpContext& c, coll::CollOptions o) {
  if (c.ex.fp8_run) o.elem_size = kFp8Bytes;
  return o;
}

const float* gather_gemm_input(const TpContext& c, const float* local, float* full, int64_t n_local) {
  if (!c.sp) return local;
  coll::all_gather(*c.dev, *c.group, coll::ConstBuffer(local, static_cast<size_t>(n_local)),
                   coll::Buffer(full, static_cast<size_t>(n_local * c.tp())), gemm_input_wire(c, c.on_compute()));
  return full;
}

const float* ring_exchange(const TpContext& c, const float* local, float* full, int64_t n_local) {
  const Time t0 = c.dev->compute().now();
  const Time start = std::max(t0, c.overlap->now());
  coll::iall_gather(*c.dev, *c.group, coll::ConstBuffer(local, static_cast<size_t>(n_local)),
                   coll::Buffer(full, static_cast<size_t>(n_local * c.tp())), gemm_input_wire(c, on_side(c, t0, 1)));
  const Time d = c.overlap->now() - start;
  const int tp = c.tp();
  std::vector<Time> ready(static_cast<size_t>(tp));
  ready[0] = t0;  // this rank's own rows
  for (int k = 1; k < tp; ++k) ready[size_t(k)] = start + d * k / (tp - 1);
  c.ex.sink->split_next_gemm(std::move(ready));
  return full;
}

}  // namespace

const float* gather_into_gemm(const TpContext& c, const float* local, float* full, int64_t rows_local, int width) {
  if (!tp_overlapping(c)) return gather_gemm_input(c, local, full, rows_local * width);
  return ring_exchange(c, local, full, rows_local * width);
}

const float* gather_into_gemm_bwd(const TpContext& c, const float* dlocal, float* dfull, int64_t rows_local,
                                  int width) {
  if (!tp_overlapping(c)) return gather_gemm_input(c, dlocal, dfull, rows_local * width);
  return ring_exchange(c, dlocal, dfull, rows_local * width);
}

void reduce_scatter_after_gemm(const TpContext& c, float* partial, float* out, int64_t rows_local, int width) {
  if (!tp_overlapping(c)) return exit_row_parallel(c, partial, out, rows_local, width);
  const auto [gs, ge] = c.ex.sink->last_gemm();
  // The GEMM on fewer SMs: its chunks end at gs + (k+1)·g.
  const Time gemm = ge - gs + sm_margin(*c.dev, ge - gs, ge - gs, kTpOverlapPipelineSms);
  const Time g = gemm / kTpOverlapSplits;
  const Time first = gs + g;
  const Time start = std::max(first, c.overlap->now());
  const int64_t n = rows_local * width;
  coll::ireduce_scatter(*c.dev, *c.group, coll::ConstBuffer(partial, static_cast<size_t>(n * c.tp())),
                       coll::Buffer(out, static_cast<size_t>(n)), coll::ReduceOp::kSum,
                       on_side(c, first, kTpOverlapPipelineSms));
  const Time d = c.overlap->now() - start;
  // Chunk k's reduce-scatter ends at max over j <= k of ready_j + (k-j+1)·d/splits:
  // the last one at the later of the comm-bound and the GEMM-bound end.
  const Time end = std::max(start + d, gs + gemm + d / kTpOverlapSplits);
  c.dev->compute().wait({end});
}

const float* gather_for_wgrad(const TpContext& c, const float* local, float* full, int64_t rows_local, int width,
                              int sms) {
  if (!tp_overlapping(c)) return gather_gemm_input(c, local, full, rows_local * width);
  const int64_t n = rows_local * width;
  coll::iall_gather(*c.dev, *c.group, coll::ConstBuffer(local, static_cast<size_t>(n)),
                   coll::Buffer(full, static_cast<size_t>(n * c.tp())),
                   gemm_input_wire(c, on_side(c, c.dev->compute().now(), sms)));
  return full;
}

void reduce_scatter_beside_wgrad(const TpContext& c, float* dfull, float* dlocal, int64_t rows_local, int width,
                                 int sms) {
  if (!tp_overlapping(c)) return enter_column_parallel_bwd(c, dfull, dlocal, rows_local, width);
  const auto [ws, we] = c.ex.sink->last_gemm();
  const Time start = std::max(ws, c.overlap->now());
  const int64_t n = rows_local * width;
  coll::ireduce_scatter(*c.dev, *c.group, coll::ConstBuffer(dfull, static_cast<size_t>(n * c.tp())),
                       coll::Buffer(dlocal, static_cast<size_t>(n)), coll::ReduceOp::kSum, on_side(c, ws, sms));
  const Time end = c.overlap->now();
  // The wgrad shared the SMs with it over their common span.
  const Time slowed = we + sm_margin(*c.dev, we - ws, std::min(end, we) - std::max(start, ws), sms);
  c.dev->compute().wait({std::max(end, slowed)});
}

}  // namespace shardlab::parallel
