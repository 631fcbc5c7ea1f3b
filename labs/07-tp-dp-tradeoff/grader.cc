// Lab 7 grader: seed 000's trade-off on 8 GPUs, GPT-3 13B (bf16, phantom):
// TP8, TP4xDP2, TP2xDP4 and DP8, each with ZeRO 0 and ZeRO 2. Runs the
// README's commands, prints the table (step, peak memory, communication),
// and checks your answers: which configs fit in 80 GB, which is fastest,
// and your closed-form model-state memory (18 bytes a parameter in mixed
// precision) against the report (2%: the replicated LayerNorms and biases).
#include <fmt/format.h>

#include <optional>

#include "labs/common/grade.h"

namespace shardlab::labs {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
const char* kModel = "--model gpt3-13b --seq 512 --batch 16 --precision bf16 --phantom --steps 1";

struct Config {
  const char* name;
  const char* flags;
};
constexpr Config kConfigs[] = {
    {"tp8", "--tp 8"}, {"tp4dp2", "--tp 4 --dp 2"}, {"tp2dp4", "--tp 2 --dp 4"}, {"dp8", "--dp 8"}};

struct Result {
  std::optional<nlohmann::json> report;  // empty: did not fit
  double step() const { return report->at("summary").at("virtual_step_s").get<double>(); }
  // Parameters, gradients, master weights and Adam's moments on device 0.
  double model_state() const {
    const auto& k = report->at("devices").at(0).at("peak_bytes_by_kind");
    return k.at("param").get<double>() + k.at("grad").get<double>() + k.at("master").get<double>() +
           k.at("optimizer").get<double>();
  }
};

Result run(Grade& g, const Config& c, int zero) {
  const ToolRun r =
      run_shardlab(fmt::format("train {} {} --zero {} --json", kModel, c.flags, zero));
  if (r.code == 2 && r.err.find("out of memory") != std::string::npos) {
    g.observe(fmt::format("ZeRO {} {:<7} does not fit: {}", zero, c.name, r.err.substr(0, 120)));
    return {};
  }
  if (r.code != 0)
    throw CannotGrade{
        fmt::format("train {} --zero {} exited {}: {}", c.flags, zero, r.code, r.err)};
  Result res{nlohmann::json::parse(r.out)};
  const auto& d = res.report->at("devices").at(0);
  g.observe(
      fmt::format("ZeRO {} {:<7} step {:6.1f} ms, peak {:5.1f} GiB, comm {:6.1f} ms of which "
                  "exposed {:6.1f} ms",
                  zero, c.name, res.step() * 1e3, d.at("peak_bytes").get<double>() / kGiB,
                  d.at("comm_total_s").get<double>() * 1e3, d.at("comm_s").get<double>() * 1e3));
  return res;
}

// The config with the shortest step among those that fit.
std::string fastest(const std::vector<Result>& results) {
  int best = -1;
  for (int i = 0; i < 4; ++i)
    if (results[size_t(i)].report &&
        (best < 0 || results[size_t(i)].step() < results[size_t(best)].step()))
      best = i;
  return best < 0 ? "none" : kConfigs[best].name;
}

void check_word(Grade& g, const Answers& a, const std::string& key, const std::string& choices,
                const std::string& want) {
  if (auto v = a.word(g, key, choices))
    g.check(*v == want, "your " + key, "the table above says " + want);
}

int grade(int argc, char** argv) {
  const Answers a = Answers::load(argc > 1 ? argv[1] : LAB_ANSWERS);
  Grade g(7, "seed 000: TP4xDP2 versus TP2xDP4 (and TP8, DP8), GPT-3 13B on 8 GPUs");
  if (!a.complete(g)) return g.finish();
  std::vector<Result> zero0, zero2;
  for (const Config& c : kConfigs) zero0.push_back(run(g, c, 0));
  for (const Config& c : kConfigs) zero2.push_back(run(g, c, 2));
  const char* configs = "tp8|tp4dp2|tp2dp4|dp8";
  check_word(g, a, "zero0_tp2dp4_fits", "yes|no", zero0[2].report ? "yes" : "no");
  check_word(g, a, "zero0_dp8_fits", "yes|no", zero0[3].report ? "yes" : "no");
  check_word(g, a, "zero0_fastest", configs, fastest(zero0));
  check_word(g, a, "zero2_fastest", configs, fastest(zero2));
  check_word(g, a, "zero2_dp8_fits", "yes|no", zero2[3].report ? "yes" : "no");
  if (zero0[1].report) {
    const double got = zero0[1].model_state() / kGiB;
    if (auto v = a.number(g, "zero0_tp4dp2_model_state_GiB"))
      g.check(near(*v, got, 0.02), "your zero0_tp4dp2_model_state_GiB", versus(*v, got, 0.02));
  }
  return g.finish();
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) {
  return shardlab::labs::run_grader(7, "[ANSWERS_FILE]", shardlab::labs::grade, argc, argv);
}
