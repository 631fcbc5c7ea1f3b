// Lab 6 grader: seed 001's question, TP 8 versus PP 8 for 96 layers x 4096
// on 8 GPUs, answered by the emulator. Runs the grid of the README
// (`shardlab train ... --phantom`, batch 1..32, a100-nvlink and a100-pcie,
// `--tp 8` against `--pp 8 --micro-batches B`, and 24 layers on PCIe at
// batch 8) and checks your answers: the winners, the crossovers, and what
// the seed's own formula (its simulate_tp/simulate_pp, evaluated here)
// predicts. A wrong answer is only told it is wrong; the curves are printed
// once every answer is right.
#include <fmt/format.h>

#include <map>

#include "labs/common/grade.h"

namespace shardlab::labs {
namespace {

constexpr int kBatches[] = {1, 2, 4, 8, 16, 32};
const char* kCrossovers = "none|1|2|4|8|16|32";
const char* kModel =
    "--embd 4096 --heads 32 --seq 128 --vocab 51200 --precision bf16 --phantom --steps 1";

struct Point {
  double tp = 0, pp = 0;  // virtual step seconds
  std::string winner() const { return tp <= pp ? "tp" : "pp"; }
};

Point run_point(const std::string& profile, int layers, int batch) {
  const std::string base =
      fmt::format("{} --layers {} --batch {} --profile {}", kModel, layers, batch, profile);
  auto step = [](const nlohmann::json& j) {
    return j.at("summary").at("virtual_step_s").get<double>();
  };
  return {step(run_train(base + " --tp 8")),
          step(run_train(fmt::format("{} --pp 8 --micro-batches {}", base, batch)))};
}

// The seed's simulate_tp / simulate_pp (its section 7), as written there.
std::string seed_winner(int batch, double bw) {
  const double hidden = 4096, layers = 96, flops = 312e12;
  const double t_tp = layers * (2 * batch * hidden * hidden / flops / 8 + 4 * hidden * hidden / bw);
  const double mb = std::min(batch, 4), per_stage = layers / 8;
  const double compute = 2 * mb * per_stage * hidden * hidden / flops;
  const double bubble = 7.0 / (8 + batch / mb - 1);
  const double t_pp = per_stage * compute + bubble * compute + mb * hidden * 4 / bw;
  return t_tp < t_pp ? "tp" : "pp";
}

// The smallest batch whose winner differs from batch 1's, or "none".
std::string crossover(const std::map<int, Point>& curve) {
  for (const auto& [batch, p] : curve)
    if (p.winner() != curve.begin()->second.winner()) return std::to_string(batch);
  return "none";
}

std::map<int, Point> curve(Grade& g, const std::string& profile) {
  std::map<int, Point> c;
  for (int b : kBatches) {
    c[b] = run_point(profile, 96, b);
    g.observe(fmt::format("{} batch {:>2}: TP 8 {:7.1f} ms, PP 8 {:7.1f} ms -> {}", profile, b,
                          c[b].tp * 1e3, c[b].pp * 1e3, c[b].winner()));
  }
  return c;
}

int grade(int argc, char** argv) {
  const Answers a = Answers::load(argc > 1 ? argv[1] : LAB_ANSWERS);
  Grade g(6, "seed 001: TP 8 versus PP 8, 96 layers x 4096, NVLink and PCIe");
  if (!a.complete(g)) return g.finish();
  a.check_word(g, "seed_code_winner_nvlink_batch16", "tp|pp", seed_winner(16, 600e9),
               "evaluate the seed's two functions at batch 16 as its loop calls them (README)");
  const auto nvlink = curve(g, "a100-nvlink"), pcie = curve(g, "a100-pcie");
  const std::string run = "run the README's grid on that profile and compare the two step times";
  a.check_word(g, "nvlink_winner_batch1", "tp|pp", nvlink.at(1).winner(), run);
  a.check_word(g, "nvlink_winner_batch32", "tp|pp", nvlink.at(32).winner(), run);
  a.check_word(g, "nvlink_crossover_batch", kCrossovers, crossover(nvlink), run);
  a.check_word(g, "pcie_winner_batch1", "tp|pp", pcie.at(1).winner(), run);
  a.check_word(g, "pcie_winner_batch32", "tp|pp", pcie.at(32).winner(), run);
  a.check_word(g, "pcie_crossover_batch", kCrossovers, crossover(pcie), run);
  const Point shallow = run_point("a100-pcie", 24, 8);
  g.observe(fmt::format("a100-pcie, 24 layers, batch 8: TP 8 {:.1f} ms, PP 8 {:.1f} ms",
                        shallow.tp * 1e3, shallow.pp * 1e3));
  a.check_word(g, "pcie_batch8_winner_24_layers", "tp|pp", shallow.winner(),
               "run the README's two commands with 24 layers");
  return g.finish();
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) {
  return shardlab::labs::run_grader(6, "[ANSWERS_FILE]", shardlab::labs::grade, argc, argv);
}
