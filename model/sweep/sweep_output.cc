// Sweep outputs: the metrics read off a train report, points.csv, points.json.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/sweep/sweep.h"
#include "runtime/errors.h"

namespace shardlab::sweep {
namespace {

constexpr double kGiB = 1.0 / double(1ull << 30);

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& metric) {
  if (!j.is_object() || !j.contains(key))
    throw ConfigError(fmt::format("metric {}: the train report has no \"{}\"", metric, key));
  return j[key];
}

// The largest value of devices[].<key> (or devices[].peak_bytes_by_kind.<kind>).
double max_over_devices(const nlohmann::json& report, const std::string& metric, const char* key,
                        const char* kind = nullptr) {
  double best = 0;
  for (const auto& d : field(report, "devices", metric)) {
    const nlohmann::json& v = kind ? field(field(d, key, metric), kind, metric) : field(d, key, metric);
    best = std::max(best, v.get<double>());
  }
  return best;
}

double steps(const nlohmann::json& report, const std::string& metric) {
  return double(std::max<size_t>(1, field(report, "steps", metric).size()));
}

double summary(const nlohmann::json& report, const std::string& metric, const char* key) {
  return field(field(report, "summary", metric), key, metric).get<double>();
}

}  // namespace

const std::vector<MetricInfo>& metrics() {
  static const std::vector<MetricInfo> all = {
      {"virtual_step_s", "step time (ms, virtual)", 1e3, "virtual seconds per training step"},
      {"tokens_per_s", "tokens per second (virtual)", 1, "global batch x seq over the virtual step time"},
      {"mfu", "MFU (%)", 100, "model FLOPs utilization, nanoGPT's 6N + 12LHQT"},
      {"hfu", "HFU (%)", 100, "hardware FLOPs utilization (recomputation included)"},
      {"model_tflops_per_gpu", "model TFLOP/s per GPU", 1, "model FLOP/s per GPU / 1e12"},
      {"hardware_tflops_per_gpu", "hardware TFLOP/s per GPU", 1, "FLOP/s the GPUs ran per GPU / 1e12"},
      {"bubble_fraction", "pipeline bubble (%)", 100, "idle share of the forward-backward phase"},
      {"peak_memory_bytes", "peak memory per device (GiB)", kGiB, "the highest device peak"},
      {"peak_activation_bytes", "peak activations per device (GiB)", kGiB, "the highest activation peak"},
      {"peak_param_bytes", "peak parameters per device (GiB)", kGiB, "the highest parameter peak"},
      {"peak_grad_bytes", "peak gradients per device (GiB)", kGiB, "the highest gradient peak"},
      {"peak_optimizer_bytes", "peak AdamW state per device (GiB)", kGiB, "the highest Adam m+v peak"},
      {"comm_s", "exposed communication per step (ms)", 1e3,
       "the most any device spends per step in communication not hidden under compute"},
      {"comm_total_s", "communication per step (ms)", 1e3, "the most any device communicates per step"},
      {"compute_s", "compute per step (ms)", 1e3, "the most any device computes per step"},
      {"idle_s", "idle per step (ms)", 1e3, "the most any device idles per step"},
      {"host_tokens_per_s", "host tokens per second", 1, "this machine's training rate"},
      {"final_loss", "final loss (nats)", 1, "the loss of the last step (real runs only)"},
  };
  return all;
}

const MetricInfo& metric_info(const std::string& name) {
  std::string known;
  for (const MetricInfo& m : metrics()) {
    if (name == m.name) return m;
    known += (known.empty() ? "" : ", ") + std::string(m.name);
  }
  throw ConfigError(fmt::format("`metric`: unknown \"{}\" (one of: {})", name, known));
}

double metric_value(const std::string& name, const nlohmann::json& report) {
  const MetricInfo& m = metric_info(name);
  const std::string n = m.name;
  if (n == "tokens_per_s") {
    const auto& config = field(report, "config", n);
    const double tokens = field(config, "batch", n).get<double>() * field(field(config, "model", n), "seq", n).get<double>();
    const double step = summary(report, n, "virtual_step_s");
    return step > 0 ? tokens / step : 0;
  }
  static const std::vector<std::pair<std::string, const char*>> kinds = {
      {"peak_activation_bytes", "activation"}, {"peak_param_bytes", "param"},
      {"peak_grad_bytes", "grad"}, {"peak_optimizer_bytes", "optimizer"}};
  for (const auto& [metric, kind] : kinds)
    if (n == metric) return max_over_devices(report, n, "peak_bytes_by_kind", kind);
  if (n == "final_loss" && report.contains("phantom"))
    throw ConfigError("metric final_loss: a phantom run computes no loss");
  if (n == "peak_memory_bytes") return max_over_devices(report, n, "peak_bytes");
  for (const char* per_step : {"comm_s", "comm_total_s", "compute_s", "idle_s"})
    if (n == per_step) return max_over_devices(report, n, per_step) / steps(report, n);
  return summary(report, n, m.name);  // the rest are summary fields of the same name
}

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::vector<std::string> varied_flags(const std::vector<Axis>& axes) {
  std::vector<std::string> flags;
  for (const Axis& a : axes) flags.insert(flags.end(), a.flags.begin(), a.flags.end());
  return flags;
}

}  // namespace

std::string points_csv(const std::vector<Axis>& axes, const std::vector<std::string>& metric_names,
                       const std::vector<PointResult>& results) {
  std::vector<std::string> header = {"point"};
  const std::vector<std::string> flags = varied_flags(axes);
  header.insert(header.end(), flags.begin(), flags.end());
  header.insert(header.end(), metric_names.begin(), metric_names.end());
  header.insert(header.end(), {"error", "wall_s"});
  auto line = [](const std::vector<std::string>& fields) {
    std::string out;
    for (const std::string& f : fields) out += (out.empty() ? "" : ",") + csv_field(f);
    return out + "\n";
  };
  std::string out = line(header);
  for (size_t i = 0; i < results.size(); ++i) {
    const PointResult& r = results[i];
    std::vector<std::string> row = {std::to_string(i)};
    for (const Setting& s : r.point.settings) row.push_back(s.value);
    for (size_t m = 0; m < metric_names.size(); ++m) row.push_back(r.ok() ? fmt::format("{:.9g}", r.metrics[m]) : "");
    row.push_back(r.error);
    row.push_back(fmt::format("{:.3f}", r.wall_s));
    out += line(row);
  }
  return out;
}

nlohmann::json points_json(const std::vector<Axis>& axes, const std::vector<std::string>& metric_names,
                           const std::vector<PointResult>& results) {
  nlohmann::json j;
  j["axes"] = nlohmann::json::array();
  for (const Axis& a : axes) {
    nlohmann::json values = nlohmann::json::array();
    for (const AxisValue& v : a.values) values.push_back(v.label);
    j["axes"].push_back({{"name", a.name}, {"flags", a.flags}, {"values", values}});
  }
  j["metrics"] = metric_names;
  j["points"] = nlohmann::json::array();
  for (const PointResult& r : results) {
    nlohmann::json p;
    p["config"] = nlohmann::json::object();
    for (const Setting& s : r.point.settings) p["config"][s.flag] = s.value;
    if (r.ok()) {
      p["metrics"] = nlohmann::json::object();
      for (size_t m = 0; m < metric_names.size(); ++m) p["metrics"][metric_names[m]] = r.metrics[m];
    } else {
      p["error"] = r.error;
    }
    p["wall_s"] = r.wall_s;
    j["points"].push_back(std::move(p));
  }
  return j;
}

}  // namespace shardlab::sweep
