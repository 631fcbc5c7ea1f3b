#include "runtime/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(std::string_view flag, const std::string& path, const std::string& why) {
  throw ConfigError(fmt::format("{} \"{}\": cannot write: {}", flag, path, why));
}

// The file a write lands on: a symbolic link's target (replacing the link
// itself with a file would surprise), else the path itself.
fs::path target_of(const std::string& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    fs::path resolved = fs::weakly_canonical(path, ec);
    if (!ec) return resolved;
  }
  return fs::path(path);
}

fs::path directory_of(const fs::path& target) {
  return target.has_parent_path() ? target.parent_path() : fs::path(".");
}

// An existing target that is not a regular file (/dev/null, a FIFO,
// /dev/stdout) is written in place: renaming onto it would replace the device.
bool writes_in_place(const fs::path& target) {
  std::error_code ec;
  const fs::file_status s = fs::status(target, ec);
  return !ec && fs::exists(s) && !fs::is_regular_file(s);
}

// Creates a fresh temporary file next to `target`; returns its fd and name.
int create_temporary(const fs::path& target, std::string& name) {
  static std::atomic<int> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    name = (directory_of(target) / fmt::format(".{}.{}.{}.tmp", target.filename().string(), getpid(),
                                               counter.fetch_add(1)))
               .string();
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

// Writes all of `bytes` to `fd`; false (errno set) on any failure.
bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(size_t(n));
  }
  return true;
}

}  // namespace

void check_writable(const std::string& path, std::string_view flag) {
  if (path.empty()) throw ConfigError(fmt::format("{}: empty file name", flag));
  const fs::path target = target_of(path);
  std::error_code ec;
  if (fs::is_directory(target, ec)) fail(flag, path, "it is a directory");
  if (writes_in_place(target)) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(flag, path, std::strerror(errno));
    ::close(fd);
    return;
  }
  const fs::path dir = directory_of(target);
  if (!fs::exists(dir, ec)) fail(flag, path, fmt::format("directory \"{}\" does not exist", dir.string()));
  if (!fs::is_directory(dir, ec)) fail(flag, path, fmt::format("\"{}\" is not a directory", dir.string()));
  std::string probe;
  const int fd = create_temporary(target, probe);
  if (fd < 0) fail(flag, path, fmt::format("cannot create a file in \"{}\" ({})", dir.string(), std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      if (outputs[i].second.empty() || outputs[j].second.empty()) continue;
      std::error_code ec;
      const fs::path a = fs::weakly_canonical(fs::absolute(outputs[i].second, ec), ec);
      const fs::path b = fs::weakly_canonical(fs::absolute(outputs[j].second, ec), ec);
      if (a == b && !writes_in_place(a))
        throw ConfigError(fmt::format("{} and {} both write \"{}\" (one would overwrite the other)",
                                      outputs[i].first, outputs[j].first, outputs[i].second));
    }
  }
}

StagedFile::StagedFile(std::string path, std::string_view bytes, std::string flag)
    : path_(std::move(path)), flag_(std::move(flag)) {
  const fs::path target = target_of(path_);
  if (writes_in_place(target)) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    const bool ok = fd >= 0 && write_all(fd, bytes);
    const int err = errno;
    if (fd >= 0 && ::close(fd) != 0 && ok) fail(flag_, path_, std::strerror(errno));
    if (!ok) fail(flag_, path_, std::strerror(err));
    return;  // nothing to rename
  }
  const int fd = create_temporary(target, tmp_);
  if (fd < 0) fail(flag_, path_, std::strerror(errno));
  bool ok = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int err = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    ::unlink(tmp_.c_str());
    tmp_.clear();
    fail(flag_, path_, std::strerror(err ? err : errno));
  }
}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : path_(std::move(other.path_)), tmp_(std::exchange(other.tmp_, {})), flag_(std::move(other.flag_)) {}

StagedFile::~StagedFile() {
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void StagedFile::commit() {
  if (tmp_.empty()) return;  // written in place, or already committed
  const fs::path target = target_of(path_);
  if (::rename(tmp_.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    tmp_.clear();
    fail(flag_, path_, std::strerror(err));
  }
  tmp_.clear();
}

void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view flag) {
  StagedFile file(path, bytes, std::string(flag));
  file.commit();
}

void commit_all(std::vector<StagedFile>& files) {
  for (StagedFile& f : files) f.commit();
}

}  // namespace shardlab
