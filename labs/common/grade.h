// What every lab grader shares: a list of checks that each name what is
// wrong, the learner's answers file, and running the shardlab tool.
//
// A grader prints one line per check ("ok   ..." or "FAIL ..."), then
// "lab N: PASS" or "lab N: FAIL (k of n checks)" and returns 0 or 1 from
// main; a missing or unreadable input is "lab N: cannot grade: ..." and 2.
// It never prints an expected answer: a wrong number is told which way and
// roughly how far it is off (off_by), a wrong choice only that it is wrong,
// and what the grader measured (observe) is printed only once every check
// has passed (test labs.lab_N.no_leak).
//
// Thread safety: a Grade is used from the grader's main thread only; what
// device threads find goes into a Findings (locked) and is recorded after
// the run.
#pragma once

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cluster.h"

namespace shardlab::labs {

// A grader's input is missing or malformed: exit 2 with the message.
struct CannotGrade {
  std::string message;
};

class Grade {
 public:
  // Prints its lines to stdout, or appends them to *out when out is given
  // (the Python bindings hand a grader's report to the notebook).
  explicit Grade(int lab, std::string title, std::string* out = nullptr);
  // Records one check; `what` says what is checked, `wrong` what is wrong if
  // it fails (printed only then). Returns ok.
  bool check(bool ok, const std::string& what, const std::string& wrong = "");
  // A measured figure worth seeing, printed by finish() when every check
  // passed (before that it would hand out the answers).
  void observe(const std::string& line);
  int failures() const { return failures_; }
  // Prints the verdict; the process exit code (0 pass, 1 fail).
  int finish() const;

 private:
  void say(const std::string& line) const;

  int lab_;
  std::string* out_;
  int checks_ = 0;
  int failures_ = 0;
  std::vector<std::string> observations_;
};

// Messages from device threads, recorded into a Grade after Cluster::run.
class Findings {
 public:
  void add(std::string message);
  // One check: failed with the first message (and how many more), or passed.
  void record(Grade& g, const std::string& what) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> messages_;  // GUARDED_BY(mu_)
};

// Runs `program` on `cluster`; when a device fails (an exception, a
// deadlock the watchdog found) records a failed check `what` with the
// runtime's message and returns nothing.
std::optional<RunResult> run_program(Grade& g, const std::string& what, Cluster& cluster,
                                     const Cluster::Program& program);

// |got - want| <= rel_tol * |want| (and both finite).
bool near(double got, double want, double rel_tol);
// "got 1.23, want 4.56 (tolerance 1%)": for a grader's check of the tool
// against its closed form, never for a learner's answer (it prints want).
std::string versus(double got, double want, double rel_tol);
// For a learner's answer: which way got is off and roughly how far, never
// want: "3 is too high, by about 20-50% (tolerance 5%)", "0.1 is about 5-10
// times too low (tolerance 2%)"; "(must be exact)" when rel_tol is 0.
std::string off_by(double got, double want, double rel_tol);

// Max |got[i] - want[i]|, or +inf when the sizes differ or either side holds
// a NaN or an Inf: such output fails every tolerance (std::max(worst, NaN)
// keeps worst, which would let a NaN pass; tests/support/compare.h's rule).
double max_abs_diff(const std::vector<float>& got, const std::vector<float>& want);

// The learner's answers: lines `key = value`, `#` starts a comment. A value
// still reading TODO (the untouched skeleton) is not an answer.
class Answers {
 public:
  // Throws CannotGrade when the file cannot be read or a line is not key = value.
  static Answers load(const std::string& path);
  // The number under `key`; records a failed check naming the key when it is
  // missing, TODO or not a number.
  std::optional<double> number(Grade& g, const std::string& key) const;
  // The word under `key`, lower-cased, one of `choices` (e.g. "tp|pp").
  std::optional<std::string> word(Grade& g, const std::string& key,
                                  const std::string& choices) const;
  // One check "your KEY<note>": the number under `key` is near `want`
  // (rel_tol); a wrong one is told off_by, never want.
  void check_number(Grade& g, const std::string& key, double want, double rel_tol,
                    const std::string& note = "") const;
  // One check "your KEY": the word under `key` (one of `choices`) is `want`;
  // a wrong one is told only that, and `hint`, which must not name want.
  void check_word(Grade& g, const std::string& key, const std::string& choices,
                  const std::string& want, const std::string& hint) const;
  // Records a failed check for every answer still TODO; true when none is.
  // Graders stop there: measuring first would only print the answers.
  bool complete(Grade& g) const;
  const std::string& path() const { return path_; }
  // Every `key = value` in file order (the course's own tests read the
  // reference answers with it).
  std::vector<std::pair<std::string, std::string>> entries() const;

 private:
  std::optional<std::string> raw(Grade& g, const std::string& key) const;
  std::string path_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> order_;  // keys in file order
};

// One run of the shardlab tool built next to the grader.
struct ToolRun {
  int code = -1;
  std::string out, err;  // err: its one-line message when code is 2
};
ToolRun run_shardlab(const std::string& args);
// Runs `shardlab ARGS` and parses its
// stdout as JSON; throws CannotGrade naming the command when it exits
// non-zero or prints no JSON.
nlohmann::json run_shardlab_json(const std::string& args);
// `shardlab train ARGS --json`: the run's report (the --report JSON).
nlohmann::json run_train(const std::string& train_args);

// Grader main: runs `body` and turns CannotGrade into exit code 2.
// `usage` names the arguments the grader takes ("" or "[ANSWERS_FILE]");
// more than that is a usage error.
int run_grader(int lab, const char* usage, int (*body)(int argc, char** argv), int argc,
               char** argv);

}  // namespace shardlab::labs
