// Lab 1 grader: measures the two links of a100-nvlink with `shardlab p2p`
// (device 0 -> 1 over NVLink, 0 -> 8 over InfiniBand), fits
// latency(S) = alpha + S / beta by least squares, and checks
//   - the fit itself against the profile: alpha = the link latency, beta =
//     the line rate times payload/(payload + header) of the copy engines'
//     packets (1% tolerance; the packet rounding of small messages is the rest);
//   - your alpha and beta against the fit (5%), your prediction of one
//     8 MiB message against the measured row (2%), and your payload share;
//     a wrong answer is told which way and roughly how far it is off.
#include <fmt/format.h>

#include "labs/common/grade.h"
#include "runtime/profile.h"

namespace shardlab::labs {
namespace {

constexpr double kMiB8 = 8.0 * 1024 * 1024;

struct Fit {
  double alpha_us = 0;
  double beta_GBps = 0;
  double latency_8mib_us = 0;  // the measured row
};

// Ordinary least squares of latency_us against bytes over the table's rows.
Fit measure(const std::string& args) {
  const auto j = run_shardlab_json("p2p --profile a100-nvlink --max-bytes 64MiB --json " + args);
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  Fit f;
  for (const auto& row : j.at("rows")) {
    const double x = row.at("bytes").get<double>(), y = row.at("latency_us").get<double>();
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
    if (x == kMiB8) f.latency_8mib_us = y;
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);  // us per byte
  f.alpha_us = (sy - slope * sx) / n;
  f.beta_GBps = 1e-3 / slope;  // bytes/us -> GB/s
  return f;
}

void grade_link(Grade& g, const Answers& a, const std::string& name, const LinkSpec& spec,
                const Fit& fit) {
  const double payload = spec.copy_payload_bytes;
  const double share = payload > 0 ? payload / (payload + spec.packet_header_bytes) : 1.0;
  g.observe(fmt::format("{}: fitted alpha {:.3f} us, beta {:.2f} GB/s", name, fit.alpha_us,
                        fit.beta_GBps));
  g.check(near(fit.alpha_us, spec.latency_us, 0.01),
          name + ": the fitted alpha is the profile's latency",
          versus(fit.alpha_us, spec.latency_us, 0.01));
  g.check(near(fit.beta_GBps, spec.bandwidth_GBps * share, 0.01),
          name + ": the fitted beta is the line rate x payload/(payload + header)",
          versus(fit.beta_GBps, spec.bandwidth_GBps * share, 0.01));
  a.check_number(g, name + "_alpha_us", fit.alpha_us, 0.05);
  a.check_number(g, name + "_beta_GBps", fit.beta_GBps, 0.05);
  a.check_number(g, name + "_predict_8MiB_us", fit.latency_8mib_us, 0.02, " (the measured 8 MiB row)");
  a.check_number(g, name + "_payload_share", share, 0.02, " (beta over the line rate)");
}

int grade(int argc, char** argv) {
  const Answers a = Answers::load(argc > 1 ? argv[1] : LAB_ANSWERS);
  Grade g(1, "links: latency and bandwidth from p2p, alpha-beta fit, prediction");
  if (!a.complete(g)) return g.finish();
  const HardwareProfile p = load_profile("a100-nvlink");
  grade_link(g, a, "intra", p.intra, measure("--src 0 --dst 1"));
  grade_link(g, a, "inter", p.inter, measure("--src 0 --dst 8"));
  return g.finish();
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) {
  return shardlab::labs::run_grader(1, "[ANSWERS_FILE]", shardlab::labs::grade, argc, argv);
}
