// Lab 8 grader: Mixture-of-Experts under expert parallelism.
//   Part 1, real routing: tiny with 8 experts, top-2, dp 4 x ep 4, batch 16,
//   3 steps, with no capacity limit and with --capacity-factor 1 and 2:
//   the router's load imbalance, the cap C·N·K/E on every expert's tokens,
//   and drops that fall as the capacity factor grows.
//   Part 2, assumed routing (--phantom --phantom-routing uniform|zipf:S),
//   a wider model with 8 experts, top-1, dp 8 x ep 8: expert 0's share of
//   the tokens against 1/H(E, S) (H the generalized harmonic number, 1%),
//   and the step and the worst device's all-to-all time growing with S.
// Then your answers against these runs (what was measured is printed once
// they are all right).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "labs/common/grade.h"

namespace shardlab::labs {
namespace {

const char* kTiny = "--model tiny --experts 8 --top-k 2 --dp 4 --ep 4 --batch 16 --steps 3";
const char* kWide =
    "--layers 4 --embd 1024 --heads 16 --seq 256 --vocab 32000 --batch 64 --experts 8 --top-k 1 "
    "--dp 8 --ep 8 --precision bf16 --phantom --steps 1";

int64_t drops(const nlohmann::json& j) {
  int64_t n = 0;
  for (const auto& d : j.at("devices"))
    for (const auto& l : d.at("moe").at("layers")) n += l.at("dropped").get<int64_t>();
  return n;
}

// The most tokens any expert of any MoE block received in one step.
int64_t max_tokens(const nlohmann::json& j) {
  int64_t m = 0;
  for (const auto& layer : j.at("moe"))
    for (const auto& step : layer.at("tokens_per_expert"))
      for (const auto& t : step) m = std::max(m, t.get<int64_t>());
  return m;
}

struct Skewed {
  double step = 0, worst_a2a = 0, expert0_share = 0;
  int least_a2a_device = 0;
};

Skewed run_skewed(Grade& g, const std::string& routing) {
  const auto j = run_train(fmt::format("{} --phantom-routing {}", kWide, routing));
  Skewed s{j.at("summary").at("virtual_step_s").get<double>()};
  double least = 1e300;
  for (const auto& d : j.at("devices")) {
    const double a2a = d.at("moe").at("a2a_s").get<double>();
    s.worst_a2a = std::max(s.worst_a2a, a2a);
    if (a2a < least) least = a2a, s.least_a2a_device = d.at("rank").get<int>();
  }
  const auto& tokens = j.at("moe").at(0).at("tokens_per_expert").at(0);
  double total = 0;
  for (const auto& t : tokens) total += t.get<double>();
  s.expert0_share = tokens.at(0).get<double>() / total;
  g.observe(fmt::format(
      "{:<8} step {:6.2f} ms, worst all-to-all {:6.2f} ms, least on device {}, expert 0 gets "
      "{:.1f}%",
      routing, s.step * 1e3, s.worst_a2a * 1e3, s.least_a2a_device, s.expert0_share * 100));
  return s;
}

void grade_real(Grade& g, const Answers& a) {
  const auto free_run = run_train(kTiny);
  const auto cf1 = run_train(std::string(kTiny) + " --capacity-factor 1");
  const auto cf2 = run_train(std::string(kTiny) + " --capacity-factor 2");
  const double imbalance = free_run.at("summary").at("moe_imbalance").get<double>();
  g.observe(fmt::format("imbalance {:.3f}; drops: none {}, cf 1 {}, cf 2 {}", imbalance,
                        drops(free_run), drops(cf1), drops(cf2)));
  const int64_t cap = 16 * 64 * 2 / 8;  // C·N·K/E at C = 1: N = 16 x 64 tokens, K = 2, E = 8
  g.check(max_tokens(cf1) == cap, "--capacity-factor 1 caps every expert at C·N·K/E tokens",
          versus(double(max_tokens(cf1)), double(cap), 0));
  g.check(drops(free_run) == 0 && drops(cf1) > drops(cf2) && drops(cf2) >= 0,
          "drops fall as the capacity factor grows (none without a limit)");
  a.check_number(g, "imbalance_no_capacity", imbalance, 0.02);
  a.check_number(g, "capacity_cf1_tokens", double(cap), 0);
}

void grade_skew(Grade& g, const Answers& a) {
  const Skewed uniform = run_skewed(g, "uniform"), z1 = run_skewed(g, "zipf:1"),
               z2 = run_skewed(g, "zipf:2");
  double h = 0;
  for (int e = 1; e <= 8; ++e) h += 1.0 / e;
  g.check(near(z1.expert0_share, 1 / h, 0.01), "zipf:1: expert 0 gets 1/H(8) of the tokens",
          versus(z1.expert0_share, 1 / h, 0.01));
  g.check(uniform.step < z1.step && z1.step < z2.step, "the step grows with the skew");
  g.check(uniform.worst_a2a < z1.worst_a2a && z1.worst_a2a < z2.worst_a2a,
          "the worst device's all-to-all time grows with the skew");
  a.check_number(g, "zipf1_expert0_share", z1.expert0_share, 0.02);
  a.check_word(g, "zipf1_least_a2a_device", "0|1|2|3|4|5|6|7", std::to_string(z1.least_a2a_device),
               "compare devices[].moe.a2a_s in the zipf:1 report");
}

int grade(int argc, char** argv) {
  const Answers a = Answers::load(argc > 1 ? argv[1] : LAB_ANSWERS);
  Grade g(8, "Mixture of Experts and expert parallelism: imbalance, capacity, skew");
  if (!a.complete(g)) return g.finish();
  grade_real(g, a);
  grade_skew(g, a);
  return g.finish();
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) {
  return shardlab::labs::run_grader(8, "[ANSWERS_FILE]", shardlab::labs::grade, argc, argv);
}
