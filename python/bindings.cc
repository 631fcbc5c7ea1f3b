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
    o.message = e.what();
  } catch (...) {
    cli::set_json_sink(nullptr);
    throw;
  }
  cli::set_json_sink(nullptr);
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
  shardlab::python::add_cluster_api(m);
  shardlab::python::add_lab_graders(m);
}
