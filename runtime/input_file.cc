#include "runtime/input_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab {

namespace fs = std::filesystem;

std::ifstream open_input(std::string_view label, const std::string& path, std::string_view kind,
                         std::string_view missing_hint) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    // A path through a file ("a.txt/b") or one we may not look into is not "missing".
    if (ec && ec != std::errc::no_such_file_or_directory)
      throw ConfigError(fmt::format("{}: cannot open ({})", label, ec.message()));
    throw ConfigError(fmt::format("{}: no such file{}", label, missing_hint));
  }
  if (fs::is_directory(status)) throw ConfigError(fmt::format("{}: is a directory, not {}", label, kind));
  errno = 0;
  std::ifstream in(path, std::ios::in | std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open ({})", label, errno ? std::strerror(errno) : "unreadable"));
  return in;
}

std::string read_input(std::string_view label, const std::string& path, std::string_view kind, size_t max_bytes) {
  std::ifstream in = open_input(label, path, kind);
  // Counted as the bytes come (a pipe or a device has no size): at most one
  // chunk past the cap is read before the refusal.
  std::string text;
  char chunk[1 << 16];
  do {
    in.read(chunk, sizeof chunk);
    text.append(chunk, size_t(in.gcount()));
    if (text.size() > max_bytes) throw ConfigError(fmt::format("{}: larger than {} bytes", label, max_bytes));
  } while (in);
  if (in.bad()) throw ConfigError(fmt::format("{}: cannot read ({})", label, std::strerror(errno)));
  return text;
}

}  // namespace shardlab
