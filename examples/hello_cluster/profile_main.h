// The main() of an example program that takes one optional argument, a
// hardware profile (a built-in name or a .json file; default a100-nvlink):
// `-h` / `--help` prints the usage, more arguments are a usage error (exit
// 2), a ConfigError (a bad profile) is one line and exit 2, any other error
// one line and exit 1; otherwise the exit code is run(profile)'s.
// custom_collective uses it too.
#pragma once

#include <cstdio>
#include <exception>
#include <string>

#include "runtime/errors.h"
#include "runtime/profile.h"

namespace hello {

template <class Run>
int profile_main(const char* program, int argc, char** argv, Run run) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "-h" || arg == "--help") {
    std::printf("usage: %s [PROFILE]   (PROFILE: a built-in name or a .json file; default a100-nvlink)\n", program);
    return 0;
  }
  if (argc > 2) {
    std::fprintf(stderr, "%s: error: usage: %s [PROFILE]\n", program, program);
    return 2;
  }
  try {
    return run(shardlab::load_profile(argc == 2 ? argv[1] : "a100-nvlink"));
  } catch (const shardlab::ConfigError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace hello
