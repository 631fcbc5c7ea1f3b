// Shared pieces of the fuzz harnesses (fuzz/*_fuzz.cc).
//
// A harness feeds one input to one parser. The parser's own error type for
// bad input (ConfigError) is the expected outcome and is caught; anything
// else is a finding: another exception escapes (libFuzzer reports the
// abort), a sanitizer fires, or a property of an accepted input does not
// hold (finding() aborts with what broke).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace shardlab::fuzz {

// A property of an accepted input does not hold: print it and abort, so
// libFuzzer saves the input as a crash.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "shardlab fuzz finding: %s\n", what.c_str());
  std::abort();
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// An in-memory file (memfd) that the readers open by its path
// (/proc/self/fd/N), so a harness runs the real load_*(path) functions, file
// checks included, without touching the disk.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("shardlab-fuzz", 0)) {
    if (fd_ < 0) finding("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the content with `size` bytes; returns the path that opens it.
  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) finding("ftruncate failed");
    for (size_t done = 0; done < size;) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) finding("pwrite failed");
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace shardlab::fuzz
