// shardlab: a GPU training cluster emulated on CPU threads.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli/cli.h"
#include "cli/field_flags.h"
#include "runtime/errors.h"
#include "runtime/host_cores.h"
#include "runtime/transport.h"

namespace {

// Output lost to a write error on stdout (a full disk, `--json > /dev/full`)
// is a failed run: one line on stderr and exit 2, never exit 0.
int finish_stdout(int code) {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return code;
  std::fprintf(stderr, "shardlab: error: cannot write to stdout (%s)\n",
               errno != 0 ? std::strerror(errno) : "write error");
  return 2;
}

int run(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "shardlab: error: %s\n", shardlab::cli::parse_error_line(e, app).c_str());
    return 2;
  } catch (const shardlab::ConfigError& e) {
    std::fprintf(stderr, "shardlab: error: %s\n", shardlab::cli::with_flag_names(e.what()).c_str());
    return 2;
  } catch (const shardlab::RunError& e) {
    std::fprintf(stderr, "shardlab: error: %s\n", shardlab::cli::with_flag_names(e.what()).c_str());
    switch (e.cause()) {
      case shardlab::RunCause::kInput: return 2;
      case shardlab::RunCause::kDeviceFailure: return 3;  // README "Fault injection"
      case shardlab::RunCause::kProgram:
      case shardlab::RunCause::kFolding:  // train() and serve retry unfolded; one that escapes is a bug
      case shardlab::RunCause::kDeadlock: return 1;
    }
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "shardlab: error: %s\n", shardlab::kHostOutOfMemory);
    return 2;
  } catch (const std::exception& e) {
    if (std::ferror(stdout)) return 2;  // fmt::print failed on stdout: finish_stdout says so
    std::fprintf(stderr, "shardlab: error: %s\n", shardlab::cli::with_flag_names(e.what()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun: MPI, the transport, one output (runtime/transport.h).
  shardlab::ProcessSession session(argc, argv);
  // A bad SHARDLAB_HOST_THREADS is refused before any device starts (runtime/host_cores.h).
  if (const std::string bad = shardlab::host_threads_env_error(); !bad.empty()) {
    std::fprintf(stderr, "shardlab: error: %s\n", bad.c_str());
    return session.settle(2);
  }
  CLI::App app{"shardlab: a GPU training cluster emulated on CPU threads", "shardlab"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardlab 0.1.0");
  shardlab::cli::add_commands(app);
  std::string names;
  bool known = false;
  for (const auto* sub : app.get_subcommands({})) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "shardlab: error: unknown subcommand '%s' (one of: %s)\n", argv[1], names.c_str());
    return 2;
  }
  return session.settle(finish_stdout(run(app, argc, argv)));
}
