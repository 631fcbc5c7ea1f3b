#include "labs/common/grade.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

namespace shardlab::labs {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Grade::Grade(int lab, std::string title, std::string* out) : lab_(lab), out_(out) {
  say(fmt::format("lab {}: {}\n", lab, title));
}

void Grade::say(const std::string& line) const {
  if (out_) {
    *out_ += line;
    return;
  }
  fmt::print("{}", line);
  std::fflush(stdout);
}

bool Grade::check(bool ok, const std::string& what, const std::string& wrong) {
  ++checks_;
  if (ok) {
    say(fmt::format("  ok   {}\n", what));
  } else {
    ++failures_;
    say(fmt::format("  FAIL {}{}{}\n", what, wrong.empty() ? "" : ": ", wrong));
  }
  return ok;
}

void Grade::observe(const std::string& line) { observations_.push_back(line); }

int Grade::finish() const {
  if (failures_ == 0) {
    if (!observations_.empty()) say("what the grader measured:\n");
    for (const std::string& line : observations_) say(fmt::format("       {}\n", line));
    say(fmt::format("lab {}: PASS ({} checks)\n", lab_, checks_));
    return 0;
  }
  if (!observations_.empty())
    say("(what the grader measured is printed once every check passes)\n");
  say(fmt::format("lab {}: FAIL ({} of {} checks)\n", lab_, failures_, checks_));
  return 1;
}

void Findings::add(std::string message) {
  std::lock_guard lock(mu_);
  if (std::find(messages_.begin(), messages_.end(), message) == messages_.end()) {
    messages_.push_back(std::move(message));
  }
}

void Findings::record(Grade& g, const std::string& what) const {
  std::lock_guard lock(mu_);
  if (messages_.empty()) {
    g.check(true, what);
    return;
  }
  // Device threads report in any order: the first message sorted is stable.
  const std::string first = *std::min_element(messages_.begin(), messages_.end());
  const size_t more = messages_.size() - 1;
  g.check(false, what, first + (more ? fmt::format(" (and {} more)", more) : ""));
}

std::optional<RunResult> run_program(Grade& g, const std::string& what, Cluster& cluster,
                                     const Cluster::Program& program) {
  try {
    return cluster.run(program);
  } catch (const std::exception& e) {
    g.check(false, what, std::string("the run failed: ") + e.what());
    return std::nullopt;
  }
}

bool near(double got, double want, double rel_tol) {
  return std::isfinite(got) && std::isfinite(want) &&
         std::abs(got - want) <= rel_tol * std::abs(want);
}

std::string versus(double got, double want, double rel_tol) {
  return fmt::format("got {:.6g}, want {:.6g} (tolerance {:.3g}%)", got, want, rel_tol * 100);
}

namespace {

// How far off got/want = q > 0 is, in buckets too wide to give want away:
// "about 2-5 times" when q >= 2 or q <= 1/2, else "by about 20-50%".
std::string how_far(double q) {
  const double factor = q >= 1 ? q : 1 / q;
  if (factor >= 100) return "over 100 times";
  if (factor >= 2) return factor < 5 ? "about 2-5 times" : factor < 10 ? "about 5-10 times" : "about 10-100 times";
  const double percent = std::abs(q - 1) * 100;
  double low = 0;
  for (const double edge : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0}) {
    if (percent < edge) return low == 0 ? "by less than 1%" : fmt::format("by about {:g}-{:g}%", low, edge);
    low = edge;
  }
  return "by about 50-100%";
}

}  // namespace

std::string off_by(double got, double want, double rel_tol) {
  const std::string tol =
      rel_tol > 0 ? fmt::format("(tolerance {:.3g}%)", rel_tol * 100) : "(must be exact)";
  const char* way = got > want ? "too high" : "too low";
  if (!std::isfinite(got)) return fmt::format("{} is not a finite number {}", got, tol);
  if (got == 0 || want == 0 || (got > 0) != (want > 0))
    return fmt::format("{:.6g} is {}{} {}", got, way,
                       got != 0 && want != 0 ? ", with the wrong sign" : "", tol);
  const double q = got / want;
  if (q >= 2 || q <= 0.5) return fmt::format("{:.6g} is {} {} {}", got, how_far(q), way, tol);
  return fmt::format("{:.6g} is {}, {} {}", got, way, how_far(q), tol);
}

double max_abs_diff(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

Answers Answers::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CannotGrade{"cannot read the answers file " + path};
  Answers a;
  a.path_ = path;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos || trim(line.substr(0, eq)).empty()) {
      throw CannotGrade{fmt::format("{}:{}: expected 'key = value', got '{}'", path, n, line)};
    }
    const std::string key = trim(line.substr(0, eq));
    if (a.values_.count(key))
      throw CannotGrade{fmt::format("{}:{}: '{}' is answered twice", path, n, key)};
    a.values_[key] = trim(line.substr(eq + 1));
    a.order_.push_back(key);
  }
  return a;
}

std::optional<std::string> Answers::raw(Grade& g, const std::string& key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) {
    g.check(false, "answer " + key, "missing from " + path_);
    return std::nullopt;
  }
  if (it->second.empty() || lower(it->second) == "todo") {
    g.check(false, "answer " + key, "still TODO in " + path_ + " (fill in your prediction)");
    return std::nullopt;
  }
  return it->second;
}

bool Answers::complete(Grade& g) const {
  bool all = true;
  for (const std::string& key : order_) {
    const std::string& value = values_.at(key);
    if (lower(value) == "todo" || value.empty()) all = raw(g, key).has_value() && all;
  }
  return all;
}

std::vector<std::pair<std::string, std::string>> Answers::entries() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& key : order_) out.emplace_back(key, values_.at(key));
  return out;
}

std::optional<double> Answers::number(Grade& g, const std::string& key) const {
  const auto v = raw(g, key);
  if (!v) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || !std::isfinite(x)) {
    g.check(false, "answer " + key, "'" + *v + "' is not a number");
    return std::nullopt;
  }
  return x;
}

void Answers::check_number(Grade& g, const std::string& key, double want, double rel_tol,
                           const std::string& note) const {
  if (auto v = number(g, key))
    g.check(near(*v, want, rel_tol), "your " + key + note,
            off_by(*v, want, rel_tol));
}

void Answers::check_word(Grade& g, const std::string& key, const std::string& choices,
                         const std::string& want, const std::string& hint) const {
  if (auto v = word(g, key, choices))
    g.check(*v == want, "your " + key, fmt::format("'{}' is wrong: {}", *v, hint));
}

std::optional<std::string> Answers::word(Grade& g, const std::string& key,
                                         const std::string& choices) const {
  const auto v = raw(g, key);
  if (!v) return std::nullopt;
  const std::string w = lower(*v);
  std::stringstream ss(choices);
  for (std::string c; std::getline(ss, c, '|');) {
    if (w == c) return w;
  }
  g.check(false, "answer " + key, "'" + *v + "' is not one of " + choices);
  return std::nullopt;
}

ToolRun run_shardlab(const std::string& args) {
  static int counter = 0;
  const std::string base = fmt::format("/tmp/shardlab_lab_{}_{}", getpid(), counter++);
  const std::string cmd = fmt::format("{} {} >{}.out 2>{}.err", SHARDLAB_BIN, args, base, base);
  const int status = std::system(cmd.c_str());
  ToolRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(base + ".out");
  r.err = trim(slurp(base + ".err"));
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

nlohmann::json run_shardlab_json(const std::string& args) {
  const ToolRun r = run_shardlab(args);
  if (r.code != 0)
    throw CannotGrade{fmt::format("'shardlab {}' exited {}: {}", args, r.code, r.err)};
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (j.is_discarded()) throw CannotGrade{"'shardlab " + args + "' printed no JSON"};
  return j;
}

nlohmann::json run_train(const std::string& train_args) {
  return run_shardlab_json("train " + train_args + " --json");
}

int run_grader(int lab, const char* usage, int (*body)(int argc, char** argv), int argc,
               char** argv) {
  try {
    const int max_args = *usage ? 1 : 0;
    if (argc - 1 > max_args) {
      throw CannotGrade{fmt::format("unexpected argument '{}' (usage: lab_{:02} {})",
                                    argv[max_args + 1], lab, usage)};
    }
    return body(argc, argv);
  } catch (const CannotGrade& e) {
    fmt::print(stderr, "lab {}: cannot grade: {}\n", lab, e.message);
    return 2;
  }
}

}  // namespace shardlab::labs
