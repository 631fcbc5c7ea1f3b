// Lab 7 grader: seed 000's trade-off on 8 GPUs, GPT-3 13B (bf16, phantom):
// TP8, TP4xDP2, TP2xDP4 and DP8, each with ZeRO 0 and ZeRO 2. Runs the
// README's commands and checks your answers (the table of step, peak memory
// and communication is printed once they are all right): which configs fit
// in 80 GB, which is fastest,
// and your closed-form model-state memory (18 bytes a parameter in mixed
// precision) against the report (2%: the replicated LayerNorms and biases).
// Then the inference half: TP8, TP4 x 2 replicas and TP2 x 4 replicas
// serving the same requests (shardlab serve): the KV cache a replica holds,
// the time per output token at a light load and the throughput of a burst.
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

// The inference half: each layout serving 512-token prompts, 8 requests of
// 32 new tokens at 0.5 requests/s (one at a time: the latency of a token) and
// a burst of 64 requests of 64 new tokens (the throughput).
constexpr Config kServeConfigs[] = {
    {"tp8", "--tp 8 --replicas 1"}, {"tp4dp2", "--tp 4 --replicas 2"}, {"tp2dp4", "--tp 2 --replicas 4"}};
const char* kServe = "serve --model gpt3-13b --seq 2048 --precision bf16 --phantom --prompt-len 512 --json";

struct Served {
  double kv_tokens = 0, tpot_s = 0, tokens_per_s = 0;
};

Served serve(Grade& g, const Config& c) {
  Served s;
  for (const char* load : {"--requests 8 --output-len 32 --arrival poisson:0.5",
                           "--requests 64 --output-len 64 --arrival burst"}) {
    const ToolRun r = run_shardlab(fmt::format("{} {} {}", kServe, c.flags, load));
    if (r.code != 0) throw CannotGrade{fmt::format("serve {} exited {}: {}", c.flags, r.code, r.err)};
    const nlohmann::json m = nlohmann::json::parse(r.out).at("summary");
    s.kv_tokens = m.at("kv_capacity_tokens_per_replica").get<double>();
    if (std::string(load).find("burst") != std::string::npos) s.tokens_per_s = m.at("output_tokens_per_s").get<double>();
    else s.tpot_s = m.at("tpot_s").at("p50").get<double>();
  }
  g.observe(fmt::format("serve {:<7} KV cache {:8.0f} tokens a replica, TPOT p50 {:6.2f} ms at 0.5 req/s, "
                        "burst {:7.0f} output tokens/s",
                        c.name, s.kv_tokens, s.tpot_s * 1e3, s.tokens_per_s));
  return s;
}

std::string best_of(const std::vector<Served>& s, bool lowest_tpot) {
  size_t best = 0;
  for (size_t i = 1; i < s.size(); ++i)
    if (lowest_tpot ? s[i].tpot_s < s[best].tpot_s : s[i].tokens_per_s > s[best].tokens_per_s) best = i;
  return kServeConfigs[best].name;
}

int grade(int argc, char** argv) {
  const Answers a = Answers::load(argc > 1 ? argv[1] : LAB_ANSWERS);
  Grade g(7, "seed 000: TP4xDP2 versus TP2xDP4 (and TP8, DP8), GPT-3 13B on 8 GPUs");
  if (!a.complete(g)) return g.finish();
  std::vector<Result> zero0, zero2;
  for (const Config& c : kConfigs) zero0.push_back(run(g, c, 0));
  for (const Config& c : kConfigs) zero2.push_back(run(g, c, 2));
  const char* configs = "tp8|tp4dp2|tp2dp4|dp8";
  const std::string fits = "a config fits when its model state, divided as TP and ZeRO divide it, "
                           "is under 80 GB: run it";
  const std::string fastest_hint = "run the README's grid and compare the step times of the configs that fit";
  a.check_word(g, "zero0_tp2dp4_fits", "yes|no", zero0[2].report ? "yes" : "no", fits);
  a.check_word(g, "zero0_dp8_fits", "yes|no", zero0[3].report ? "yes" : "no", fits);
  a.check_word(g, "zero0_fastest", configs, fastest(zero0), fastest_hint);
  a.check_word(g, "zero2_fastest", configs, fastest(zero2), fastest_hint);
  a.check_word(g, "zero2_dp8_fits", "yes|no", zero2[3].report ? "yes" : "no", fits);
  if (zero0[1].report)
    a.check_number(g, "zero0_tp4dp2_model_state_GiB", zero0[1].model_state() / kGiB, 0.02);
  std::vector<Served> served;
  for (const Config& c : kServeConfigs) served.push_back(serve(g, c));
  a.check_number(g, "serve_tp4_kv_tokens", served[1].kv_tokens, 0.03);
  const std::string serve_hint = "run the inference half's commands and compare the layouts";
  a.check_word(g, "serve_lowest_tpot", "tp8|tp4dp2|tp2dp4", best_of(served, true), serve_hint);
  a.check_word(g, "serve_highest_throughput", "tp8|tp4dp2|tp2dp4", best_of(served, false), serve_hint);
  return g.finish();
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) {
  return shardlab::labs::run_grader(7, "[ANSWERS_FILE]", shardlab::labs::grade, argc, argv);
}
