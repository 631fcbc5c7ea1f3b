// Every `shardlab` command README.md shows (and docs/architecture.md,
// bench/README.md, labs/README.md) parses with the tool's own flag
// tables: its subcommand exists, every flag is one of that subcommand's, and
// each value passes the flag's own check (a number in its range, a choice of
// its list). The commands are parsed, not run (the subcommands' actions are
// cleared), so the check costs milliseconds; what a command's action checks
// later (a batch that its micro-batches do not divide, a file that must
// exist) is the other tests' business. Commands are taken from the fenced
// code blocks (continuation lines joined, `NAME="..."` assignments expanded,
// `# comments` dropped) and from inline `code`; a command written as a
// template (`--tp N`, `FILE.json`, `...`) is counted and skipped.
#include <cctype>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli/cli.h"

namespace shardlab::cli {
namespace {

const char* const kSubcommands[] = {"p2p", "collectives", "train", "verify", "profiles", "sweep", "generate", "serve"};

struct Command {
  int line = 0;          // of the command, or of its paragraph's first line
  std::string text;     // from the subcommand on
  bool inline_ = false;  // from inline `code`: may be a fragment of a command
  const char* doc = "README.md";
};

// Shell words: whitespace-separated, '…' and "…" quoting (no escapes inside '…').
std::optional<std::vector<std::string>> shell_words(const std::string& s) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\'' || c == '"') {
      const size_t end = s.find(c, i + 1);
      if (end == std::string::npos) return std::nullopt;
      word += s.substr(i + 1, end - i - 1);
      in_word = true;
      i = end;
    } else if (c == '\\' && i + 1 < s.size()) {
      word += s[++i];
      in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// The line less a trailing `# comment` (a '#' after whitespace, outside quotes).
std::string without_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || std::isspace(static_cast<unsigned char>(line[i - 1])))) {
      return line.substr(0, i);
    }
  }
  return line;
}

// $NAME and ${NAME} from the assignments seen so far; nullopt when one is unknown.
std::optional<std::string> expand(const std::string& s, const std::map<std::string, std::string>& vars) {
  static const std::regex var(R"(\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?)");
  std::string out;
  auto begin = std::sregex_iterator(s.begin(), s.end(), var);
  size_t at = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto found = vars.find((*it)[1].str());
    if (found == vars.end()) return std::nullopt;
    out += s.substr(at, size_t(it->position()) - at) + found->second;
    at = size_t(it->position() + it->length());
  }
  return out + s.substr(at);
}

// The command from "shardlab SUB" on, up to a pipe, a redirection or the end.
std::optional<std::string> command_in(const std::string& text) {
  static const std::regex start(R"((?:^|[\s/])shardlab\s+([a-z0-9]+)(?:\s|$))");
  std::smatch m;
  if (!std::regex_search(text, m, start)) return std::nullopt;
  bool known = false;
  for (const char* sub : kSubcommands) known = known || m[1].str() == sub;
  if (!known) return std::nullopt;
  std::string rest = text.substr(size_t(m.position(1)));
  for (const char* end : {" | ", " > ", " 2>", " && ", "; ", " >> "}) rest = rest.substr(0, rest.find(end));
  return rest;
}

// A code fence, indented or not (a fenced block inside a list item).
bool is_fence(const std::string& line) {
  const size_t first = line.find_first_not_of(' ');
  return first != std::string::npos && line.compare(first, 3, "```") == 0;
}

std::vector<Command> readme_commands(const std::string& path, int& skipped_templates) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::vector<Command> out;
  std::map<std::string, std::string> vars;
  static const std::regex assignment(R"(^([A-Z][A-Z0-9_]*)=(.*)$)");
  static const std::regex inline_code("`([^`]+)`");
  bool fenced = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int lineno = int(i) + 1;
    if (is_fence(lines[i])) {
      fenced = !fenced;
      continue;
    }
    if (!fenced) {  // a paragraph of prose: its inline code may span lines
      std::string paragraph = lines[i];
      while (i + 1 < lines.size() && !lines[i + 1].empty() && !is_fence(lines[i + 1]))
        paragraph += " " + lines[++i];
      for (auto it = std::sregex_iterator(paragraph.begin(), paragraph.end(), inline_code); it != std::sregex_iterator(); ++it)
        if (auto c = command_in((*it)[1].str())) out.push_back({lineno, *c, true});
      continue;
    }
    std::string line = without_comment(lines[i]);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    while (line.ends_with("\\") && i + 1 < lines.size()) {  // a continued command
      line.pop_back();
      std::string next = without_comment(lines[++i]);
      while (!next.empty() && std::isspace(static_cast<unsigned char>(next.back()))) next.pop_back();
      line += " " + next;
    }
    std::smatch m;
    if (std::regex_match(line, m, assignment)) {
      const auto words = shell_words(m[2].str());
      if (words && words->size() == 1) vars[m[1].str()] = (*words)[0];
      continue;
    }
    // The README's list of subcommands (`shardlab p2p          point-to-point ...`): prose in columns.
    static const std::regex listing(R"(shardlab [a-z0-9]+ {2,}[^ -])");
    if (std::regex_search(line, listing)) continue;
    if (auto c = command_in(line)) {
      if (auto expanded = expand(*c, vars)) {
        out.push_back({lineno, *expanded});
      } else {
        ++skipped_templates;  // a variable the README does not assign
        std::printf("%s:%d: a variable it does not assign, not parsed: %s\n", path.c_str(), lineno, c->c_str());
      }
    }
  }
  return out;
}

// A template rather than a command: placeholders for values (N, FILE, DIR,
// NAME|FILE.json, a|b choices, ..., <x>, [x]).
bool is_template(const std::vector<std::string>& words) {
  static const std::regex placeholder(R"(^[A-Z][A-Z0-9_]*([.:=][A-Za-z0-9_.]*)?$|\.\.\.|[<>\[\]]|^[a-z0-9-]+\|[a-z0-9|-]+$)");
  for (const std::string& w : words)
    if (std::regex_search(w, placeholder) && !w.starts_with("--")) return true;
  return false;
}

// CLI11's message for `words` (the subcommand first), or "" when they parse.
// With `fragment`, what a fragment of a command lacks is not an error: a
// required flag (sweep's --out) or the value of a flag it ends with (prose
// that names `shardlab train --phantom --report`); an unknown flag, a bad
// value or an unknown subcommand still is.
std::string parse_error(const std::vector<std::string>& words, bool fragment = false) {
  CLI::App app{"shardlab", "shardlab"};
  app.require_subcommand(1);
  add_commands(app);
  const ParseOnly parse_only;  // no action runs
  std::vector<std::string> reversed(words.rbegin(), words.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // (The kind is the type: e.get_name() is the app's name for some errors.)
    const bool missing = dynamic_cast<const CLI::RequiredError*>(&e) != nullptr ||
                         (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr &&
                          std::string(e.what()).ends_with("missing"));
    if (fragment && missing) return "";
    return e.get_name() + ": " + e.what();
  }
  return "";
}

TEST(ReadmeCommands, EveryCommandParsesWithTheToolsFlagTables) {
  int templates = 0;
  std::vector<Command> commands;
  for (const char* doc : {"README.md", "docs/architecture.md", "bench/README.md", "labs/README.md"}) {
    std::vector<Command> more = readme_commands(std::string(SHARDLAB_SOURCE_DIR "/") + doc, templates);
    for (Command& c : more) c.doc = doc;
    commands.insert(commands.end(), more.begin(), more.end());
  }
  int parsed = 0;
  std::vector<std::string> failures;
  for (const Command& c : commands) {
    const auto words = shell_words(c.text);
    if (!words || is_template(*words)) {
      ++templates;
      std::printf("%s:%d: a template, not parsed: shardlab %s\n", c.doc, c.line, c.text.c_str());
      continue;
    }
    const std::string error = parse_error(*words, c.inline_);
    if (error.empty()) {
      ++parsed;
    } else {
      failures.push_back(fmt::format("{}:{}: shardlab {}\n    {}", c.doc, c.line, c.text, error));
    }
  }
  for (const std::string& f : failures) ADD_FAILURE() << f;
  std::printf("the documents' commands: %d parse, %zu fail, %d templates skipped\n", parsed, failures.size(), templates);
  // The extraction itself must keep finding the README's commands (72 when written).
  EXPECT_GE(parsed, 60) << "the README's commands were not found: the extraction broke";
}

// The check can fail: a renamed flag, a value out of its range and an
// unknown subcommand are each refused by the same parse.
TEST(ReadmeCommands, TheParseRefusesWhatTheToolRefuses) {
  EXPECT_EQ(parse_error({"train", "--model", "tiny", "--steps", "2"}), "");
  EXPECT_NE(parse_error({"train", "--model", "tiny", "--no-such-flag"}), "");
  EXPECT_NE(parse_error({"train", "--steps", "0"}), "");
  EXPECT_NE(parse_error({"collectives", "--op", "all_reduce", "--ranks", "x"}), "");
  EXPECT_NE(parse_error({"trian", "--steps", "2"}), "");
  EXPECT_NE(parse_error({"sweep", "--vary", "tp=1,2"}), "");                  // --out is required
  EXPECT_EQ(parse_error({"sweep", "--vary", "tp=1,2"}, /*fragment=*/true), "");  // ... in prose
  EXPECT_EQ(parse_error({"train", "--report"}, /*fragment=*/true), "");
  EXPECT_NE(parse_error({"train", "--no-such-flag"}, /*fragment=*/true), "");
  EXPECT_NE(parse_error({"train", "--tp", "0"}, /*fragment=*/true), "");
  EXPECT_EQ(command_in("build/bin/shardlab train --tp 2 | tee log"), "train --tp 2");
  EXPECT_EQ(command_in("mpirun -np 4 build/bin/shardlab verify --dp 4 > out"), "verify --dp 4");
  EXPECT_EQ(command_in("the shardlab tool"), std::nullopt);
  EXPECT_EQ(command_in("shardlab train: step 40/100"), std::nullopt);  // a line it prints
  EXPECT_TRUE(is_template({"train", "--tp", "N"}));
  EXPECT_TRUE(is_template({"train", "--schedule", "gpipe|1f1b"}));
  EXPECT_FALSE(is_template({"train", "--data", "synthetic:markov", "--memory", "64MiB"}));
  EXPECT_EQ(expand("serve $M --tp 4", {{"M", "--model gpt3-13b"}}), "serve --model gpt3-13b --tp 4");
  EXPECT_EQ(expand("serve $Q", {}), std::nullopt);
}

}  // namespace
}  // namespace shardlab::cli
