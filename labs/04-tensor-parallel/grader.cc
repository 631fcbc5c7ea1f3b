// Lab 4 grader: runs your column- and row-parallel layers on tp 2 and 4 and
// compares every rank's outputs and gradients with the unsharded layer
// computed in double precision (tolerance 1e-4 absolute on values of order
// 1; fp32 GEMMs differ from it by ~1e-6). Communication is graded by virtual
// time: your math is free (the kernels charge nothing here), so each call's
// time is exactly its collectives' — one all-reduce of the right size where
// the conjugate pair needs one (the tuner's prediction, its start included),
// none where it does not.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "collectives/tuner.h"
#include "labs/04-tensor-parallel/tp_linear.h"
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
  std::vector<double> x, w, b, dy;   // inputs: (N,C), (OC,C), (OC), (N,OC)
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
  r.y.assign(kN * kOC, 0), r.dx.assign(kN * kC, 0), r.dw.assign(size_t(kOC) * kC, 0), r.db.assign(kOC, 0);
  model::linear_forward(r.y.data(), r.x.data(), r.w.data(), r.b.data(), kN, kC, kOC);
  model::linear_backward(r.dx.data(), r.dw.data(), r.db.data(), r.dy.data(), r.x.data(), r.w.data(), kN, kC, kOC);
  return r;
}

// Block [row0, row0+rows) x [col0, col0+cols) of a row-major (.., ld) matrix, as floats.
std::vector<float> block(const std::vector<double>& m, int ld, int64_t row0, int64_t rows, int col0, int cols) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[size_t(i * cols + j)] = float(m[size_t((row0 + i) * ld + col0 + j)]);
  return out;
}

// "" or what differs, with the max difference.
std::string compare(const char* name, const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
  if (worst <= kTol) return "";
  const bool zero = std::all_of(got.begin(), got.end(), [](float v) { return v == 0; });
  return fmt::format("{}: max |diff| {:.3g} against the unsharded layer (tolerance {:g}){}", name, worst, kTol,
                     zero ? ": still all zeros" : "");
}

// One all-reduce of `count` floats over the group, as the tuner predicts it.
Time all_reduce_time(const HardwareProfile& p, const std::vector<int>& members, size_t count) {
  const collectives::CollShape s{.op = collectives::OpKind::kAllReduce, .count = count};
  return collectives::predict_time(p, members, s, collectives::select_algo(p, members, s));
}

// Checks one call's communication time on one rank.
void check_time(Findings& f, const char* call, Time got, Time want, const char* pair) {
  if (got == want) return;
  f.add(fmt::format("{} communicated for {:.3f} us, want {:.3f} us: {}", call, to_seconds(got) * 1e6,
                    to_seconds(want) * 1e6, pair));
}

struct Run {
  int tp = 2;
  HardwareProfile profile = load_profile("a100-nvlink");
  std::vector<int> members() const {
    std::vector<int> m(static_cast<size_t>(tp));
    for (int i = 0; i < tp; ++i) m[size_t(i)] = i;
    return m;
  }
};

void grade_column(Grade& g, const Reference& ref, const Run& run) {
  Findings math, time;
  const int ocl = kOC / run.tp;
  const Time dinp_reduce = all_reduce_time(run.profile, run.members(), kN * kC);
  Cluster cluster(run.profile, {.world_size = run.tp});
  cluster.run([&](Device& dev) {
    const auto tp = collectives::ProcessGroup::world(dev);
    const int r = tp.rank();
    const auto x = block(ref.x, kC, 0, kN, 0, kC), w = block(ref.w, kC, r * ocl, ocl, 0, kC);
    const auto b = block(ref.b, kOC, 0, 1, r * ocl, ocl), dy = block(ref.dy, kOC, 0, kN, r * ocl, ocl);
    std::vector<float> y(kN * ocl), dx(kN * kC), dw(static_cast<size_t>(ocl * kC)), db(static_cast<size_t>(ocl));
    Time t0 = dev.now();
    column_parallel_forward(dev, tp, y.data(), x.data(), w.data(), b.data(), kN, kC, ocl);
    check_time(time, "column_parallel_forward", dev.now() - t0, 0,
               "the input is replicated, so the forward is the identity (copy_to_tp_region)");
    t0 = dev.now();
    column_parallel_backward(dev, tp, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), kN, kC, ocl);
    check_time(time, "column_parallel_backward", dev.now() - t0, dinp_reduce,
               "exactly one all-reduce of the (N,C) input gradient (copy_to_tp_region's backward)");
    for (const std::string& e : {compare("out", y, block(ref.y, kOC, 0, kN, r * ocl, ocl)),
                                 compare("dinp", dx, block(ref.dx, kC, 0, kN, 0, kC)),
                                 compare("dweight", dw, block(ref.dw, kC, r * ocl, ocl, 0, kC)),
                                 compare("dbias", db, block(ref.db, kOC, 0, 1, r * ocl, ocl))})
      if (!e.empty()) math.add(fmt::format("rank {} {}", r, e));
  });
  math.record(g, fmt::format("column-parallel tp={}: outputs and gradients match the unsharded layer", run.tp));
  time.record(g, fmt::format("column-parallel tp={}: forward identity, backward one all-reduce", run.tp));
}

void grade_row(Grade& g, const Reference& ref, const Run& run) {
  Findings math, time;
  const int cl = kC / run.tp;
  const Time out_reduce = all_reduce_time(run.profile, run.members(), kN * kOC);
  Cluster cluster(run.profile, {.world_size = run.tp});
  cluster.run([&](Device& dev) {
    const auto tp = collectives::ProcessGroup::world(dev);
    const int r = tp.rank();
    const auto x = block(ref.x, kC, 0, kN, r * cl, cl), w = block(ref.w, kC, 0, kOC, r * cl, cl);
    const auto b = block(ref.b, kOC, 0, 1, 0, kOC), dy = block(ref.dy, kOC, 0, kN, 0, kOC);
    std::vector<float> y(kN * kOC), dx(kN * cl), dw(static_cast<size_t>(kOC * cl)), db(static_cast<size_t>(kOC));
    Time t0 = dev.now();
    row_parallel_forward(dev, tp, y.data(), x.data(), w.data(), b.data(), kN, cl, kOC);
    check_time(time, "row_parallel_forward", dev.now() - t0, out_reduce,
               "exactly one all-reduce of the (N,OC) partial outputs (reduce_from_tp_region)");
    t0 = dev.now();
    row_parallel_backward(dev, tp, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), kN, cl, kOC);
    check_time(time, "row_parallel_backward", dev.now() - t0, 0,
               "the output gradient is replicated, so the backward is the identity (reduce_from_tp_region's)");
    for (const std::string& e : {compare("out", y, block(ref.y, kOC, 0, kN, 0, kOC)),
                                 compare("dinp", dx, block(ref.dx, kC, 0, kN, r * cl, cl)),
                                 compare("dweight", dw, block(ref.dw, kC, 0, kOC, r * cl, cl)),
                                 compare("dbias", db, block(ref.db, kOC, 0, 1, 0, kOC))})
      if (!e.empty()) math.add(fmt::format("rank {} {}", r, e));
  });
  math.record(g, fmt::format("row-parallel tp={}: outputs and gradients match the unsharded layer", run.tp));
  time.record(g, fmt::format("row-parallel tp={}: forward one all-reduce, backward identity", run.tp));
}

int grade(int, char**) {
  Grade g(4, "Megatron column- and row-parallel linear layers");
  const Reference ref = make_reference();
  for (int tp : {2, 4}) {
    grade_column(g, ref, {.tp = tp});
    grade_row(g, ref, {.tp = tp});
  }
  return g.finish();
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) { return shardlab::labs::run_grader(4, shardlab::labs::grade, argc, argv); }
