#include "model/parallel/tensor/mappings.h"

#include <algorithm>

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

}  // namespace shardlab::parallel
