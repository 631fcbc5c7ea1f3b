// Shared pieces of the `shardlab` command-line tool.
//
// Each subcommand lives in its own cmd_*.cc and registers itself with
// add_<name>_command(). A subcommand's action returns the exit code; it throws
// ConfigError for bad input (exit 2, one line on stderr).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/profile.h"

namespace shardlab::cli {

using Action = std::function<int()>;

// Registers a subcommand; `action` runs when it was chosen.
void set_action(CLI::App* sub, Action action);

// The one line for a CLI11 parse error of `app` (the tool and the Python
// module print the same): an unknown flag is named in command-line order with
// the nearest flag of its subcommand ("train: unknown flag --tpp (did you
// mean --tp?)"), a flag given twice or without its value says so, an on/off
// flag given a value says it takes none; other errors keep CLI11's words.
std::string parse_error_line(const CLI::ParseError& e, const CLI::App& app);

// The long flag of `sub` nearest to `flag` by edit distance ("--tpp" ->
// "--tp"; a --no- negation counts), or "" when none is within a few edits.
std::string nearest_flag(const CLI::App& sub, const std::string& flag);

// While one is alive on this thread, a parsed command's action does not run:
// its flags are parsed and checked (names, values, ranges) and nothing else
// (tests/cli/readme_commands_test.cc checks the README's commands so).
class ParseOnly {
 public:
  ParseOnly();
  ~ParseOnly();
  ParseOnly(const ParseOnly&) = delete;
  ParseOnly& operator=(const ParseOnly&) = delete;
};

// A command's --json result: printed on stdout (2-space indent), or handed to
// the sink this thread set (the Python bindings, python/, take the value
// itself). Null: stdout.
void print_json(const nlohmann::json& j);
using JsonSink = std::function<void(const nlohmann::json&)>;
void set_json_sink(JsonSink sink);

// Flags most subcommands share.
struct CommonFlags {
  std::string profile = "a100-nvlink";
  std::optional<int> nodes;  // unset: the profile's own node count
  bool json = false;
  std::string trace;
  double pace = 0;
  int verbose = 0;
};
void add_common_flags(CLI::App* sub, CommonFlags& flags, bool with_trace = true);
// Applies -v and loads the profile (ConfigError on a bad one).
HardwareProfile apply_common(const CommonFlags& flags);

// Flag value checks that CLI11 runs while parsing, before anything starts;
// CLI11 prefixes the flag: "--batch: 0 is out of range: must be between 1
// and 16777216". NaN and infinities are refused everywhere; an explicit value
// is never replaced by a default.
//   number_in(lo, hi):        lo <= v <= hi
//   number_above(lo, hi):     lo <  v <= hi (a positive rate, a tolerance)
//   nonempty():               a file name or spec that is not ""
CLI::Validator number_in(double lo, double hi);
CLI::Validator number_above(double lo, double hi);
CLI::Validator nonempty();
inline constexpr double kMaxPace = 1e6;  // wall seconds per virtual second

// The files a run writes, {flag, path} (empty paths skipped): each checked
// writable and all distinct before the run (runtime/output_file.h).
void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);
// One file of a run: written after it, all of them or none (empty paths skipped).
struct Output {
  std::string flag, path, bytes;
};
void write_outputs(const std::vector<Output>& outputs);

// --min-bytes / --max-bytes: both parsed, 1 <= min <= max <= 4 GiB, or ConfigError.
std::pair<uint64_t, uint64_t> parse_size_range(const std::string& min_text, const std::string& max_text);

// Every subcommand below, in --help's order (the tool's and the Python module's).
void add_commands(CLI::App& app);
void add_collectives_command(CLI::App& app);
void add_p2p_command(CLI::App& app);
void add_profiles_command(CLI::App& app);
void add_train_command(CLI::App& app);
// The per-device table of a train report (train's and verify's summaries).
void print_device_table(const nlohmann::json& report);
// Peak bytes by kind of every device of report["devices"] (called by print_device_table).
void print_memory_table(const nlohmann::json& devices);
void add_verify_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);

}  // namespace shardlab::cli
