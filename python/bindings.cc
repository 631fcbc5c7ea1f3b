// _shardlab: the C++ half of the Python package (python/shardlab).
//
// The commands: run_command(["train", "--tp=2", ...]) parses the arguments
// with the `shardlab` tool's own flag tables (cli/), runs the command's own
// code and returns the value it prints with --json (cli/cli.h print_json),
// not its text. So a keyword argument is a flag, checked and bound by the
// same rows, and a result is the CLI's JSON value bit for bit: there is no
// second list of options and no second implementation.
//
// The command runs on a thread of its own (python/run_thread.h): Ctrl-C
// cancels it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "python/cluster_api.h"
#include "python/lab_graders.h"
#include "python/run_thread.h"

namespace py = pybind11;

namespace shardlab::python {
namespace {

// Runs `shardlab ARGS...` on this thread, as cli/main.cc does, with the
// --json value handed over instead of printed.
void run_cli(const std::vector<std::string>& args, Outcome& o) {
  CLI::App app{"shardlab", "shardlab"};
  app.require_subcommand(1);
  cli::add_commands(app);
  cli::set_json_sink([&o](const nlohmann::json& j) { o.json = j.dump(); });
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::RuntimeError& e) {  // the command's nonzero exit code (cli.cc set_action)
    o.code = e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    o.error = "config";
    o.message = cli::parse_error_line(e, app);  // the tool's line (cli/main.cc)
  } catch (...) {
    cli::set_json_sink(nullptr);
    throw;
  }
  cli::set_json_sink(nullptr);
}

// The flags of `command` by what they take: {"--sp": true, "--no-prefetch":
// false, "--tp": null, ...}: a switch that turns something on (true), a
// switch's negation (false: `--no-x` beside `--x`), a flag with a value
// (None). The keyword arguments map through it (python/shardlab/commands.py).
py::dict flag_kinds(const std::string& command) {
  CLI::App app{"shardlab", "shardlab"};
  cli::add_commands(app);
  const CLI::App* sub = app.get_subcommand(command);  // throws CLI::OptionNotFound for an unknown one
  py::dict kinds;
  for (const CLI::Option* opt : sub->get_options()) {
    const bool is_switch = opt->get_expected_min() == 0;
    for (const std::string& name : opt->get_lnames()) kinds[py::str("--" + name)] = is_switch ? py::object(py::bool_(true)) : py::none();
    for (std::string name : opt->get_fnames()) {
      while (name.starts_with('-')) name.erase(0, 1);
      kinds[py::str("--" + name)] = py::bool_(false);
    }
  }
  // A separate --no-x beside a switch --x (--tie-embeddings, --no-tie-embeddings) is x's negation.
  for (const auto& [name, kind] : py::dict(kinds)) {
    const std::string flag = py::str(name);
    if (flag.starts_with("--no-") && kinds.contains(py::str("--" + flag.substr(5)))) kinds[name] = py::bool_(false);
  }
  return kinds;
}

}  // namespace
}  // namespace shardlab::python

PYBIND11_MODULE(_shardlab, m) {
  m.doc() = "shardlab's C++ half: the commands (run_command), the virtual cluster (Cluster), the code labs' graders";
  m.def(
      "run_command",
      [](const std::vector<std::string>& args, py::object tick, py::object on_step) {
        return shardlab::python::run_interruptible([args](shardlab::python::Outcome& o) { shardlab::python::run_cli(args, o); },
                                                   std::move(tick), std::move(on_step));
      },
      py::arg("args"), py::arg("tick") = py::none(), py::arg("on_step") = py::none(),
      "Runs `shardlab ARGS... --json` in process; returns {code, json, error, message, rank, cause}; "
      "tick(seconds) about once a second while it runs, on_step(step, steps, virtual_s, loss) after each step.");
  m.def("flag_kinds", &shardlab::python::flag_kinds, py::arg("command"),
        "The command's flags: True for a switch, False for a switch's negation (--no-x), None for a flag with a value.");
  shardlab::python::add_cluster_api(m);
  shardlab::python::add_lab_graders(m);
}
