// labs_no_leak GRADER REFERENCE_ANSWERS README: a command-driven lab must
// not hand out its answers (labs/README.md, "How grading works").
//
// Writes an answers file with a wrong value for every answer of the
// reference (a number 1.5x the reference; a small integer such as a device or
// a batch halved, or 1 for 0 and 2 for 1; a word swapped for another of its
// choices), runs GRADER on it and fails when
//   - the grader does not exit 1 with "FAIL your KEY" for every answer;
//   - a number it prints is a numeric answer at the precision printed: at
//     least two significant digits, within half a unit of its last digit plus
//     kSlack (1%) of the answer (the reference answers are themselves
//     rounded); "36.8%" is also read as 0.368, "342,736" as 342736;
//   - a line other than the header, the verdict and the "ok" lines names a
//     word answer (tp, yes, overlap, none, a device number) as a whole word,
//     in any case; in a "FAIL your KEY" line only what follows the key, but
//     for the wrong word written for KEY (the grader repeating it);
//   - README (outside its ``` blocks) prints a numeric answer in the same way.
// A number equal to one of the wrong values written is the grader echoing
// the learner's answer and is not a leak. A one-digit answer (an alpha of
// 2 us) is only found when printed with a decimal ("2.0"): a bare "2" is
// everywhere. Bad input: one line and exit 2.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "labs/common/grade.h"

namespace shardlab::labs {
namespace {

constexpr double kSlack = 0.01;

// What an answer looks like to this test.
struct Answer {
  std::string key, value;  // the reference answer
  bool word = false;       // a word or a small integer: found as a whole word
  double number = 0;       // its value, when not a word
  std::string wrong;       // what this test answers instead
};

std::optional<double> parse_number(const std::string& s) {
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || !std::isfinite(x)) return std::nullopt;
  return x;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Another of the answer's choices.
std::string wrong_word(const std::string& key, const std::string& word) {
  static const std::map<std::string, std::string> kOther = {
      {"tp", "pp"},     {"pp", "tp"},         {"yes", "no"},          {"no", "yes"},
      {"none", "2"},    {"overlap", "no-overlap"}, {"no-overlap", "overlap"},
      {"tp8", "tp4dp2"}, {"dp8", "tp8"},     {"tp4dp2", "tp8"},      {"tp2dp4", "tp8"}};
  const auto it = kOther.find(lower(word));
  if (it == kOther.end())
    throw CannotGrade{fmt::format("no wrong value known for {} = {} (add one to kOther)", key, word)};
  return it->second;
}

std::vector<Answer> reference_answers(const std::string& path) {
  std::vector<Answer> out;
  for (const auto& [key, value] : Answers::load(path).entries()) {
    Answer a{key, value};
    const auto x = parse_number(value);
    const bool small_int =  // written as an integer: a device, a batch
        x && value.find_first_of(".eE") == std::string::npos && std::abs(*x) < 100;
    a.word = !x || small_int;
    if (!a.word) a.number = *x, a.wrong = fmt::format("{:.6g}", *x * 1.5);
    else if (small_int) a.wrong = fmt::format("{:.0f}", *x >= 2 ? std::floor(*x / 2) : *x + 1);
    else a.wrong = wrong_word(key, value);
    out.push_back(a);
  }
  return out;
}

// A number as printed: its value and half a unit of its last digit.
struct Printed {
  std::string text;
  double value = 0, half_ulp = 0;
  int significant = 0;
};

Printed printed(std::string text, bool percent) {
  Printed p{text};
  std::erase(text, ',');
  const size_t e = text.find_first_of("eE");
  const std::string mantissa = text.substr(0, e);
  const double scale = (e == std::string::npos ? 1 : std::pow(10, std::stod(text.substr(e + 1)))) *
                       (percent ? 0.01 : 1);
  const size_t dot = mantissa.find('.');
  std::string digits = mantissa;
  std::erase(digits, '.');
  digits.erase(0, digits.find_first_not_of('0'));
  int unit_exp = dot == std::string::npos ? 0 : -int(mantissa.size() - dot - 1);
  if (dot == std::string::npos)  // 345000: the zeros are not digits
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back(), ++unit_exp;
  p.significant = int(digits.size());
  p.value = std::stod(mantissa) * scale;
  p.half_ulp = 0.5 * std::pow(10, unit_exp) * scale;
  return p;
}

// Every number in `line` not part of a name (a100, zero0, tp4dp2); a
// percentage twice, as printed and as a fraction.
std::vector<Printed> numbers(const std::string& line) {
  static const std::regex kNumber(
      R"(([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(\.[0-9]+)?([eE][-+]?[0-9]+)?(%?))");
  std::vector<Printed> out;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), kNumber); it != std::sregex_iterator();
       ++it) {
    const size_t at = size_t(it->position());
    if (at > 0 && (std::isalpha(static_cast<unsigned char>(line[at - 1])) || line[at - 1] == '_'))
      continue;
    const std::string text = (*it)[1].str() + (*it)[2].str() + (*it)[3].str();
    out.push_back(printed(text, false));
    if ((*it)[4].matched && (*it)[4].length() > 0) out.push_back(printed(text, true));
  }
  return out;
}

bool shows(const Printed& p, double answer) {
  return p.significant >= 2 && std::abs(p.value - answer) <= p.half_ulp + kSlack * std::abs(answer);
}

bool echoes_wrong(const Printed& p, const std::vector<Answer>& answers) {
  for (const Answer& a : answers)
    if (!a.word && std::abs(p.value - std::stod(a.wrong)) <= p.half_ulp + 1e-9 * std::abs(p.value))
      return true;
  return false;
}

// The whole words of `text`, lower-cased.
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  for (char c : text + " ") {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') {
      w += c;
      continue;
    }
    while (!w.empty() && (w.back() == '.' || w.back() == '-')) w.pop_back();
    if (!w.empty()) out.push_back(lower(w));
    w.clear();
  }
  return out;
}

std::string run(const std::string& command, int& code) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw CannotGrade{"cannot run " + command};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string write_wrong_answers(const std::vector<Answer>& answers) {
  char path[] = "/tmp/shardlab_no_leak_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw CannotGrade{"cannot create a temporary answers file"};
  close(fd);
  std::ofstream f(path);
  for (const Answer& a : answers) f << a.key << " = " << a.wrong << "\n";
  return path;
}

// The answers whose value `shown` is, as "KEY = VALUE" (several keys may share one).
std::string named(const std::vector<Answer>& answers, const std::function<bool(const Answer&)>& shown) {
  std::string keys, value;
  for (const Answer& a : answers)
    if (shown(a)) keys += (keys.empty() ? "" : ", ") + a.key, value = a.value;
  return keys.empty() ? "" : keys + " = " + value;
}

// Leaks in one line of the grader's output or of the README.
// `echo`: the learner's wrong word this line repeats, not a leak.
void scan_line(const std::string& where, const std::string& line, const std::vector<Answer>& answers,
               bool with_words, std::vector<std::string>& leaks, const std::string& echo = "") {
  for (const Printed& p : numbers(line)) {
    if (echoes_wrong(p, answers)) continue;
    const std::string n = named(answers, [&](const Answer& a) { return !a.word && shows(p, a.number); });
    if (!n.empty()) leaks.push_back(fmt::format("{} shows {} as '{}': {}", where, n, p.text, line));
  }
  if (!with_words) return;
  std::set<std::string> seen;
  for (const std::string& w : words(line)) {
    if (w == lower(echo) || !seen.insert(w).second) continue;
    const std::string n = named(answers, [&](const Answer& a) { return a.word && w == lower(a.value); });
    if (!n.empty()) leaks.push_back(fmt::format("{} names {}: {}", where, n, line));
  }
}

void scan_output(const std::string& out, const std::vector<Answer>& answers,
                 std::vector<std::string>& leaks) {
  static const std::regex kVerdict(R"(^lab [0-9]+: (PASS|FAIL) )");
  std::istringstream in(out);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (n == 1 || std::regex_search(line, kVerdict) || line.rfind("  ok   ", 0) == 0) continue;
    std::string text = line, echo;  // in "FAIL your KEY...", what follows the key
    for (const Answer& a : answers) {
      const size_t at = line.find("FAIL your " + a.key);
      if (at != std::string::npos) text = line.substr(at + 10 + a.key.size()), echo = a.wrong;
    }
    scan_line(fmt::format("the grader's line {}", n), text, answers, true, leaks, echo);
  }
}

// The margin: for each numeric answer, the nearest number the grader printed
// (but the learner's echoed values), relative to the answer.
void print_nearest(const std::string& out, const std::vector<Answer>& answers) {
  const std::vector<Printed> all = numbers(out);
  for (const Answer& a : answers) {
    if (a.word) continue;
    const Printed* best = nullptr;
    for (const Printed& p : all)
      if (p.significant >= 2 && !echoes_wrong(p, answers) &&
          (!best || std::abs(p.value - a.number) < std::abs(best->value - a.number)))
        best = &p;
    if (best)
      fmt::print("no_leak: {} = {}: the nearest number printed is '{}', {:.3g}% off\n", a.key, a.value,
                 best->text, std::abs(best->value - a.number) / std::abs(a.number) * 100);
  }
}

void scan_readme(const std::string& path, const std::vector<Answer>& answers,
                 std::vector<std::string>& leaks) {
  std::ifstream in(path);
  if (!in) throw CannotGrade{"cannot read " + path};
  std::string line;
  bool code = false;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("```", 0) == 0) code = !code;
    if (!code) scan_line(fmt::format("{}:{}", path, n), line, answers, false, leaks);
  }
}

// Every answer was graded and found wrong.
void check_all_failed(const std::string& out, const std::vector<Answer>& answers,
                      std::vector<std::string>& leaks) {
  for (const Answer& a : answers) {
    const std::regex failed("FAIL your " + a.key + "([^A-Za-z0-9_]|$)");
    if (!std::regex_search(out, failed))
      leaks.push_back(fmt::format("no 'FAIL your {}' for the wrong answer {} = {}", a.key, a.key, a.wrong));
  }
}

int check(int argc, char** argv) {
  if (argc != 4) throw CannotGrade{"usage: labs_no_leak GRADER REFERENCE_ANSWERS README"};
  const std::vector<Answer> answers = reference_answers(argv[2]);
  const std::string wrong = write_wrong_answers(answers);
  int code = 0;
  const std::string out = run(fmt::format("'{}' '{}'", argv[1], wrong), code);
  std::remove(wrong.c_str());
  fmt::print("{}", out);
  std::vector<std::string> leaks;
  if (code != 1) leaks.push_back(fmt::format("the grader exited {} on wrong answers, want 1", code));
  check_all_failed(out, answers, leaks);
  scan_output(out, answers, leaks);
  print_nearest(out, answers);
  scan_readme(argv[3], answers, leaks);
  fmt::print("no_leak: {} answers, each wrong; a printed number shows an answer when within half a "
             "unit of its last digit + {:g}% of it\n",
             answers.size(), kSlack * 100);
  for (const std::string& l : leaks) fmt::print("  FAIL {}\n", l);
  fmt::print("no_leak: {}\n", leaks.empty() ? "PASS" : fmt::format("FAIL ({} findings)", leaks.size()));
  return leaks.empty() ? 0 : 1;
}

}  // namespace
}  // namespace shardlab::labs

int main(int argc, char** argv) {
  try {
    return shardlab::labs::check(argc, argv);
  } catch (const shardlab::labs::CannotGrade& e) {
    fmt::print(stderr, "labs_no_leak: {}\n", e.message);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "labs_no_leak: {}\n", e.what());
    return 2;
  }
}
