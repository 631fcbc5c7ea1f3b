#include "cli/cli.h"

#include <cmath>

#include <fmt/format.h>

#include "cli/flag_table.h"
#include "runtime/errors.h"
#include "runtime/log.h"
#include "runtime/output_file.h"
#include "runtime/parse_number.h"
#include "runtime/units.h"

namespace shardlab::cli {

namespace {
thread_local int t_parse_only = 0;  // ParseOnly guards alive on this thread
}  // namespace

ParseOnly::ParseOnly() { ++t_parse_only; }
ParseOnly::~ParseOnly() { --t_parse_only; }

void set_action(CLI::App* sub, Action action) {
  // CLI11 callbacks return void; stash the exit code in the app's final callback.
  // The lambda also owns what the flags are bound to (inside `action`).
  sub->final_callback([sub, action] {
    if (t_parse_only > 0) return;
    int code = action();
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

namespace {

// What is wrong with `text` as a number (parse_number.h's rule), or "".
std::string number_fault(const std::string& text, bool integer) {
  const std::optional<double> v = parse_whole<double>(text);
  if (!v) return fmt::format("\"{}\" is not a number", text);
  if (!std::isfinite(*v)) return fmt::format("{} is not a finite number", text);
  if (integer && !parse_whole<int64_t>(text) && !parse_whole<uint64_t>(text))
    return fmt::format("{} is not an integer", text);
  return "";
}

CLI::Validator number_check(double lo, double hi, bool open_below) {
  const std::string rule = open_below ? fmt::format("must be above {} and at most {}", lo, hi)
                                      : fmt::format("must be between {} and {}", lo, hi);
  return CLI::Validator(
      [lo, hi, open_below, rule](std::string& text) -> std::string {
        const std::string fault = number_fault(text, false);
        if (!fault.empty()) return fault + ": " + rule;
        const double v = *parse_whole<double>(text);
        if (v < lo || v > hi || (open_below && v == lo)) return fmt::format("{} is out of range: {}", text, rule);
        return "";
      },
      open_below ? fmt::format("({}, {}]", lo, hi) : fmt::format("[{}, {}]", lo, hi));
}

}  // namespace

CLI::Validator number_text(bool integer) {
  return CLI::Validator([integer](std::string& text) { return number_fault(text, integer); }, "");
}

CLI::Validator number_in(double lo, double hi) { return number_check(lo, hi, false); }
CLI::Validator number_above(double lo, double hi) { return number_check(lo, hi, true); }

CLI::Validator nonempty() {
  return CLI::Validator([](std::string& text) { return text.empty() ? std::string("must not be empty") : ""; },
                        "");
}

void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (const auto& [flag, path] : outputs)
    if (!path.empty()) check_writable(path, flag);
  check_distinct_outputs(outputs);
}

void write_outputs(const std::vector<Output>& outputs) {
  std::vector<StagedFile> staged;  // a failure removes the ones staged before it
  for (const Output& o : outputs)
    if (!o.path.empty()) staged.emplace_back(o.path, o.bytes, o.flag);
  commit_all(staged);
}

void add_common_flags(CLI::App* sub, CommonFlags& flags, bool with_trace) {
  sub->add_option("--profile", flags.profile, "Hardware profile: a built-in name or FILE.json")
      ->capture_default_str()
      ->check(nonempty());
  sub->add_option("--nodes", flags.nodes,
                  "Nodes of the profile's node type (default: the profile's own count)")
      ->check(number_in(1, double(kMaxDevices)));
  sub->add_flag("--json", flags.json, "Machine-readable output on stdout");
  if (with_trace) {
    sub->add_option("--trace", flags.trace, "Write a Chrome trace (opens in Perfetto) to FILE.json")
        ->check(nonempty());
    sub->add_option("--pace", flags.pace,
                    "Play out in wall-clock time: X wall seconds per virtual second (0 = off)")
        ->check(number_in(0, kMaxPace));
  }
  sub->add_flag("-v,--verbose", flags.verbose, "More logging (-v info, -vv debug)");
}

HardwareProfile apply_common(const CommonFlags& flags) {
  set_verbosity(flags.verbose);
  HardwareProfile p = load_profile(flags.profile);
  if (flags.nodes) {
    // A profile describes one node type and its links; --nodes sets how many.
    const int nodes = *flags.nodes;
    if (nodes < 1 || int64_t{nodes} * p.devices_per_node > kMaxDevices)
      throw ConfigError(fmt::format("--nodes {}: must be between 1 and {} ({} devices per node, at most {} devices)",
                                    nodes, kMaxDevices / p.devices_per_node, p.devices_per_node, kMaxDevices));
    p.nodes = nodes;
  }
  return p;
}

std::pair<uint64_t, uint64_t> parse_size_range(const std::string& min_text, const std::string& max_text) {
  const uint64_t lo = parse_bytes(min_text, "--min-bytes");
  const uint64_t hi = parse_bytes(max_text, "--max-bytes");
  if (lo == 0) throw ConfigError("--min-bytes must be at least 1");
  if (lo > hi) throw ConfigError(fmt::format("--min-bytes {} is above --max-bytes {}", lo, hi));
  if (hi > (4ull << 30)) throw ConfigError("--max-bytes: at most 4GiB");
  return {lo, hi};
}

}  // namespace shardlab::cli
