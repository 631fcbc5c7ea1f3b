// Lab 4 grader: runs your column- and row-parallel layers on tp 2 and 4 and
// compares every rank's outputs and gradients with the unsharded layer
// computed in double precision (tolerance 1e-4 absolute on values of order
// 1; fp32 GEMMs differ from it by ~1e-6; a NaN or Inf anywhere fails, whatever
// the tolerance). Communication is graded by virtual
// time: your math is free (the kernels charge nothing here), so each call's
// time is exactly its collectives' — one all-reduce of the right size where
// the conjugate pair needs one (the tuner's prediction, its start included),
// none where it does not. The same checks grade the C++ exercise
// (grader_main.cc) and the notebook's Python functions (python/lab_graders.cc).
#include "labs/04-tensor-parallel/grader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "collectives/tuner.h"
#include "labs/common/grade.h"
#include "model/kernels.h"
#include "runtime/cluster.h"

namespace shardlab::labs {
namespace {

constexpr int64_t kN = 16;
constexpr int kC = 32, kOC = 48;
constexpr double kTol = 1e-4;

// The unsharded layer and its gradients, in double.
struct Reference {
  std::vector<double> x, w, b, dy;    // inputs: (N,C), (OC,C), (OC), (N,OC)
  std::vector<double> y, dx, dw, db;  // (N,OC), (N,C), (OC,C), (OC)
};

Reference make_reference() {
  Reference r;
  std::mt19937 rng(4);
  std::normal_distribution<double> normal(0, 1);
  auto fill = [&](std::vector<double>& v, size_t n) {
    v.resize(n);
    for (double& e : v) e = std::round(normal(rng) * 64) / 64;  // exact in fp32
  };
  fill(r.x, kN * kC), fill(r.w, size_t(kOC) * kC), fill(r.b, kOC), fill(r.dy, kN * kOC);
  r.y.assign(kN * kOC, 0), r.dx.assign(kN * kC, 0), r.dw.assign(size_t(kOC) * kC, 0),
      r.db.assign(kOC, 0);
  model::linear_forward(r.y.data(), r.x.data(), r.w.data(), r.b.data(), kN, kC, kOC);
  model::linear_backward(r.dx.data(), r.dw.data(), r.db.data(), r.dy.data(), r.x.data(), r.w.data(),
                         kN, kC, kOC);
  return r;
}

// Block [row0, row0+rows) x [col0, col0+cols) of a row-major (.., ld) matrix, as floats.
std::vector<float> block(const std::vector<double>& m, int ld, int64_t row0, int64_t rows, int col0,
                         int cols) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      out[size_t(i * cols + j)] = float(m[size_t((row0 + i) * ld + col0 + j)]);
  return out;
}

// "" or what differs, with the max difference.
std::string compare(const char* name, const std::vector<float>& got,
                    const std::vector<float>& want) {
  const double worst = max_abs_diff(got, want);  // inf when got holds a NaN or Inf
  if (worst <= kTol) return "";
  const bool zero = std::all_of(got.begin(), got.end(), [](float v) { return v == 0; });
  const bool finite = std::all_of(got.begin(), got.end(), [](float v) { return std::isfinite(v); });
  return fmt::format("{}: max |diff| {:.3g} against the unsharded layer (tolerance {:g}){}", name,
                     worst, kTol, zero ? ": still all zeros" : !finite ? ": it holds NaN or Inf" : "");
}

// One all-reduce of `count` floats over the group, as the tuner predicts it.
Time all_reduce_time(const HardwareProfile& p, const std::vector<int>& members, size_t count) {
  const collectives::CollShape s{.op = collectives::OpKind::kAllReduce, .count = count};
  return collectives::predict_time(p, members, s, collectives::select_algo(p, members, s));
}

// Checks one call's communication time on one rank.
void check_time(Findings& f, const std::string& call, Time got, Time want, const char* pair) {
  if (got == want) return;
  f.add(fmt::format("{} communicated for {:.3f} us, want {:.3f} us: {}", call,
                    to_seconds(got) * 1e6, to_seconds(want) * 1e6, pair));
}

// What rank r of a layer gets (x, w, b, dy) and must produce (y, dx, dw, db),
// each a block of the unsharded tensors.
struct Slices {
  std::vector<float> x, w, b, dy, y, dx, dw, db;
};

// Column-parallel: rows [r·OCl, (r+1)·OCl) of w, b and the columns of y, dy.
Slices column_slices(const Reference& ref, int tp, int r) {
  const int o = kOC / tp;
  return {block(ref.x, kC, 0, kN, 0, kC),     block(ref.w, kC, r * o, o, 0, kC),
          block(ref.b, kOC, 0, 1, r * o, o),  block(ref.dy, kOC, 0, kN, r * o, o),
          block(ref.y, kOC, 0, kN, r * o, o), block(ref.dx, kC, 0, kN, 0, kC),
          block(ref.dw, kC, r * o, o, 0, kC), block(ref.db, kOC, 0, 1, r * o, o)};
}

// Row-parallel: columns [r·Cl, (r+1)·Cl) of x, w, dx, dw; y, dy, b whole.
Slices row_slices(const Reference& ref, int tp, int r) {
  const int c = kC / tp;
  return {block(ref.x, kC, 0, kN, r * c, c),   block(ref.w, kC, 0, kOC, r * c, c),
          block(ref.b, kOC, 0, 1, 0, kOC),     block(ref.dy, kOC, 0, kN, 0, kOC),
          block(ref.y, kOC, 0, kN, 0, kOC),    block(ref.dx, kC, 0, kN, r * c, c),
          block(ref.dw, kC, 0, kOC, r * c, c), block(ref.db, kOC, 0, 1, 0, kOC)};
}

// One layer kind: its slices, the floats each pass all-reduces
// (0: none) and what that pass's communication should be.
struct Layer {
  const char* name;
  Slices (*slices)(const Reference&, int tp, int r);
  bool split_inputs;  // row-parallel: the C dimension is split, else OC
  int64_t forward_reduce, backward_reduce;
  const char* forward_pair;
  const char* backward_pair;
};

const Layer kColumn{
    "column_parallel",
    column_slices,
    false,
    0,
    kN* kC,
    "the input is replicated, so the forward is the identity (copy_to_tp_region)",
    "exactly one all-reduce of the (N,C) input gradient (copy_to_tp_region's backward)"};
const Layer kRow{
    "row_parallel",
    row_slices,
    true,
    kN* kOC,
    0,
    "exactly one all-reduce of the (N,OC) partial outputs (reduce_from_tp_region)",
    "the output gradient is replicated, so the backward is the identity (reduce_from_tp_region's)"};

void grade_layer(Grade& g, const Reference& ref, const Layer& layer, const TpForward& forward,
                 const TpBackward& backward, int tp) {
  const HardwareProfile p = load_profile("a100-nvlink");
  std::vector<int> members(static_cast<size_t>(tp));
  for (int i = 0; i < tp; ++i) members[size_t(i)] = i;
  auto reduce_time = [&](int64_t n) {
    return n == 0 ? Time(0) : all_reduce_time(p, members, size_t(n));
  };
  const int c = layer.split_inputs ? kC / tp : kC, oc = layer.split_inputs ? kOC : kOC / tp;
  Findings math, time;
  std::mutex mu;
  double worst = 0;  // GUARDED_BY(mu): over ranks and tensors
  const std::string what = fmt::format("{} tp={}: ", layer.name, tp);
  Cluster cluster(p, {.world_size = tp});
  const auto ran = run_program(g, what + "forward and backward run", cluster, [&](Device& dev) {
    const auto group = collectives::ProcessGroup::world(dev);
    const Slices s = layer.slices(ref, tp, group.rank());
    std::vector<float> y(s.y.size()), dx(s.dx.size()), dw(s.dw.size()), db(s.db.size());
    Time t0 = dev.now();
    forward(dev, group, y.data(), s.x.data(), s.w.data(), s.b.data(), kN, c, oc);
    check_time(time, fmt::format("{}_forward", layer.name), dev.now() - t0,
               reduce_time(layer.forward_reduce), layer.forward_pair);
    t0 = dev.now();
    backward(dev, group, dx.data(), dw.data(), db.data(), s.dy.data(), s.x.data(), s.w.data(),
                   kN, c, oc);
    check_time(time, fmt::format("{}_backward", layer.name), dev.now() - t0,
               reduce_time(layer.backward_reduce), layer.backward_pair);
    for (const std::string& e : {compare("out", y, s.y), compare("dinp", dx, s.dx),
                                 compare("dweight", dw, s.dw), compare("dbias", db, s.db)})
      if (!e.empty()) math.add(fmt::format("rank {} {}", group.rank(), e));
    std::lock_guard lock(mu);
    for (double d : {max_abs_diff(y, s.y), max_abs_diff(dx, s.dx), max_abs_diff(dw, s.dw),
                     max_abs_diff(db, s.db)})
      worst = std::max(worst, d);  // d is inf, never NaN, for a non-finite output
  });
  if (!ran) return;
  math.record(
      g, what + fmt::format("outputs and gradients match the unsharded layer (max |diff| {:.2g}, "
                            "tolerance {:g})",
                            worst, kTol));
  time.record(g, what + (layer.forward_reduce ? "forward one all-reduce, backward identity"
                                              : "forward identity, backward one all-reduce"));
}

}  // namespace

int grade_tp_linear(const TpLinear& fns, std::string* out) {
  Grade g(4, "Megatron column- and row-parallel linear layers", out);
  const Reference ref = make_reference();
  for (int tp : {2, 4}) {
    grade_layer(g, ref, kColumn, fns.column_forward, fns.column_backward, tp);
    grade_layer(g, ref, kRow, fns.row_forward, fns.row_backward, tp);
  }
  return g.finish();
}

}  // namespace shardlab::labs
