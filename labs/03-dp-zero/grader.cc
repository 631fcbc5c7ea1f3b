// Lab 3 grader: trains tiny on 4 data-parallel GPUs with ZeRO 0, 1 and 2
// (`shardlab train --model tiny --dp 4 --zero Z --bucket-mb 0.25 --steps 2
// --json`), reads device 0's peak bytes by kind, and checks
//   - the report against the closed forms of the ZeRO paper for fp32 AdamW:
//     parameters 4P and gradients 4P bytes, Adam's moments 8P, divided by dp
//     for ZeRO 1; ZeRO 2 keeps 4P/dp of gradients plus at most two buckets
//     in flight (chunk rounding: 1%);
//   - your predictions against the report (3%; ZeRO 2's gradients 10%), and which of overlap and
//     --no-overlap gives the shorter step, and that without overlap every
//     microsecond of communication is exposed.
#include <fmt/format.h>

#include "labs/common/grade.h"

namespace shardlab::labs {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kBucketBytes = 0.25e6;
constexpr int kDp = 4;

const char* kRun = "--model tiny --dp 4 --bucket-mb 0.25 --steps 2";

struct Memory {
  double param = 0, grad = 0, optimizer = 0;  // bytes, device 0's peaks
};

Memory measure(int zero) {
  const auto j = run_train(fmt::format("{} --zero {}", kRun, zero));
  const auto& k = j.at("devices").at(0).at("peak_bytes_by_kind");
  return {k.at("param").get<double>(), k.at("grad").get<double>(), k.at("optimizer").get<double>()};
}

void check_mib(Grade& g, const Answers& a, const std::string& key, double measured_bytes,
               double tol = 0.03) {
  a.check_number(g, key, measured_bytes / kMiB, tol);
}

void grade_memory(Grade& g, const Answers& a, double params) {
  const Memory z0 = measure(0), z1 = measure(1), z2 = measure(2), z3 = measure(3);
  g.observe(fmt::format("ZeRO 0: param {:.2f} MiB, grad {:.2f} MiB, Adam {:.2f} MiB",
                        z0.param / kMiB, z0.grad / kMiB, z0.optimizer / kMiB));
  g.observe(fmt::format("ZeRO 3 (question 4): param {:.2f} MiB, of which the shard 4P/dp is {:.2f}",
                        z3.param / kMiB, 4 * params / kDp / kMiB));
  g.check(z0.param == 4 * params && z0.grad == 4 * params,
          "ZeRO 0 holds 4P bytes of parameters and of gradients",
          fmt::format("param {} and grad {} bytes, P = {}", z0.param, z0.grad, params));
  g.check(z0.optimizer == 8 * params, "ZeRO 0 holds 8P bytes of Adam moments",
          versus(z0.optimizer, 8 * params, 0));
  g.check(near(z1.optimizer, 8 * params / kDp, 0.01), "ZeRO 1 divides Adam's moments by dp",
          versus(z1.optimizer, 8 * params / kDp, 0.01));
  g.check(z1.grad == z0.grad, "ZeRO 1 keeps every gradient", versus(z1.grad, z0.grad, 0));
  const double floor = 4 * params / kDp;
  g.check(
      z2.grad >= floor * 0.99 && z2.grad <= floor + 2 * kBucketBytes,
      "ZeRO 2 keeps its gradient chunk 4P/dp plus at most two 0.25 MB buckets",
      fmt::format("{:.0f} bytes, want {:.0f} .. {:.0f}", z2.grad, floor, floor + 2 * kBucketBytes));
  check_mib(g, a, "zero0_param_MiB", z0.param);
  check_mib(g, a, "zero0_grad_MiB", z0.grad);
  check_mib(g, a, "zero0_optimizer_MiB", z0.optimizer);
  check_mib(g, a, "zero1_optimizer_MiB", z1.optimizer);
  check_mib(g, a, "zero2_grad_MiB", z2.grad,
            0.1);  // buckets hold whole tensors: a bit over 0.25 MB
}

void grade_overlap(Grade& g, const Answers& a) {
  const auto on = run_train(fmt::format("{} --zero 0", kRun));
  const auto off = run_train(fmt::format("{} --zero 0 --no-overlap", kRun));
  const double t_on = on.at("summary").at("virtual_step_s").get<double>();
  const double t_off = off.at("summary").at("virtual_step_s").get<double>();
  const auto& d = off.at("devices").at(0);
  const double exposed = d.at("comm_s").get<double>(), total = d.at("comm_total_s").get<double>();
  g.observe(fmt::format("step {:.1f} us with overlap, {:.1f} us without", t_on * 1e6, t_off * 1e6));
  g.check(near(exposed, total, 1e-9), "--no-overlap: all of the communication is exposed",
          versus(exposed, total, 1e-9));
  a.check_word(g, "faster", "overlap|no-overlap", t_on < t_off ? "overlap" : "no-overlap",
               "compare the two runs' virtual step times");
}

int grade(int argc, char** argv) {
  const Answers a = Answers::load(argc > 1 ? argv[1] : LAB_ANSWERS);
  Grade g(3, "data parallelism and ZeRO: memory per device");
  if (!a.complete(g)) return g.finish();
  const double params =
      run_train("--model tiny --steps 1").at("summary").at("n_params").get<double>();
  a.check_number(g, "n_params", params, 0);
  grade_memory(g, a, params);
  grade_overlap(g, a);
  return g.finish();
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) {
  return shardlab::labs::run_grader(3, "[ANSWERS_FILE]", shardlab::labs::grade, argc, argv);
}
