// The one line for a parse error of the tool's flags (cli.h
// parse_error_line), and the nearest flag to a mistyped one.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/field_flags.h"

namespace shardlab::cli {

namespace {

// Edits (insert, delete, substitute) from a to b.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

// The flag of `sub` nearest to `flag` ("--tpp" -> "--tp"), or "" when none is near.
std::string nearest_flag(const CLI::App& sub, const std::string& flag) {
  std::string best;
  size_t best_d = std::max<size_t>(2, flag.size() / 4) + 1;
  for (const CLI::Option* opt : sub.get_options()) {
    std::vector<std::string> names = opt->get_lnames();
    for (const std::string& f : opt->get_fnames()) names.push_back(f.starts_with("-") ? f.substr(f.find_first_not_of('-')) : f);
    for (const std::string& name : names) {
      const size_t d = edit_distance(flag, "--" + name);
      if (d < best_d) best_d = d, best = "--" + name;
    }
  }
  return best;
}

std::string parse_error_line(const CLI::ParseError& e, const CLI::App& app) {
  const std::string what = e.what();
  const std::vector<CLI::App*> chosen = app.get_subcommands();
  const CLI::App* sub = chosen.empty() ? nullptr : chosen.back();
  // (e.get_name() is the app's name for some errors: the kind is the type.)
  if (dynamic_cast<const CLI::ExtrasError*>(&e) && sub) {
    const std::vector<std::string> extras = app.remaining(true);  // in command-line order (CLI11 hands a subcommand's unknown flags up)
    for (const std::string& word : extras) {
      if (!word.starts_with("-")) continue;
      const std::string flag = word.substr(0, word.find('='));
      const std::string near = nearest_flag(*sub, flag);
      return fmt::format("{}: unknown flag {}{}", sub->get_name(), flag,
                         near.empty() ? fmt::format(" (shardlab {} --help lists its flags)", sub->get_name())
                                      : fmt::format(" (did you mean {}?)", near));
    }
    if (!extras.empty())
      return fmt::format("{}: unexpected argument \"{}\" (its options are --flags: shardlab {} --help)", sub->get_name(),
                         extras.front(), sub->get_name());
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    const size_t colon = what.find(": ");
    const std::string flag = colon == std::string::npos ? "" : what.substr(0, colon);
    if (what.find("At Most 1 required but received") != std::string::npos)
      return flag + " is given more than once: give it once";
    if (what.ends_with("missing") && flag.starts_with("--")) {
      // CLI11's "1 required INT:[1, 1048576] missing": the type and its range, in words.
      std::string expected = what.substr(colon + 2, what.size() - colon - 2 - 8);
      if (expected.starts_with("1 required ")) expected = expected.substr(11);
      const size_t range = expected.find(':');
      const std::string type = expected.substr(0, range);
      const std::string kind = type == "INT" || type == "UINT" ? "an integer" : type == "FLOAT" ? "a number" : "";
      if (kind.empty()) return flag + " needs a value";
      return fmt::format("{} needs a value: {}{}", flag, kind,
                         range == std::string::npos ? "" : " in " + expected.substr(range + 1));
    }
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) && what == "A subcommand is required") {
    std::string names;
    for (const CLI::App* s : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + s->get_name();
    return "a subcommand is required (one of: " + names + "; shardlab --help)";
  }
  return with_flag_hint(what);
}

}  // namespace shardlab::cli
