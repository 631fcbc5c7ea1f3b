// The subcommands as a whole (main.cc's app, the Python module's) and where
// their --json value goes. Apart from cli.cc: fuzz/'s `size` harness builds
// cli.cc alone.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace shardlab::cli {

namespace {

thread_local JsonSink t_json_sink;  // per thread: each Python call runs a command on its own thread

}  // namespace

void print_json(const nlohmann::json& j) {
  if (t_json_sink) t_json_sink(j);
  else fmt::print("{}\n", j.dump(2));
}

void add_commands(CLI::App& app) {
  add_collectives_command(app);
  add_p2p_command(app);
  add_profiles_command(app);
  add_train_command(app);
  add_verify_command(app);
  add_sweep_command(app);
  add_generate_command(app);
  add_serve_command(app);
}

void set_json_sink(JsonSink sink) { t_json_sink = std::move(sink); }

}  // namespace shardlab::cli
