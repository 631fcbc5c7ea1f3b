// The files the tool writes (--save, --report, --trace): checked before the
// run, written atomically after it.
//
// A run can take minutes; a bad output path must not be found only at its
// end, and a failed write must not leave half a file behind (nor replace a
// good file from an earlier run with a truncated one). So:
//  - check_writable() runs before any thread starts: it creates (and removes)
//    a probe file in the target's directory, the only honest test of "can I
//    write here" (permissions, read-only mounts, root's exceptions).
//  - StagedFile writes the bytes to a temporary file in the same directory
//    (same file system, so the rename is atomic) and renames it into place
//    on commit(). An uncommitted one removes its temporary file: several
//    outputs are staged first and committed together, so one failing write
//    leaves none of them (all-or-nothing up to the renames themselves).
// Every error is a ConfigError of one line naming the flag and the path.
//
// Thread safety: the functions may run on any thread; the temporary names
// come from an atomic counter (plus the process id), so concurrent staged
// files never collide. A StagedFile is used by one thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardlab {

// Throws ConfigError("FLAG "PATH": ...") when `path` is empty, is a directory,
// its directory is missing, or no file can be created there.
void check_writable(const std::string& path, std::string_view flag);

// Throws ConfigError when two non-empty outputs name the same file (one
// would overwrite the other). `outputs`: {flag, path} pairs.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

// One output file being written. Not copyable; movable.
class StagedFile {
 public:
  // Writes `bytes` to a new temporary file next to `path` (flushed and closed).
  StagedFile(std::string path, std::string_view bytes, std::string flag);
  StagedFile(StagedFile&& other) noexcept;
  StagedFile& operator=(StagedFile&&) = delete;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  ~StagedFile();  // removes the temporary file unless committed

  // Renames the temporary file onto `path`.
  void commit();

 private:
  std::string path_, tmp_, flag_;
};

// StagedFile + commit: `path` holds `bytes` afterwards, or is untouched.
void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view flag);

// Commits every staged file in order.
void commit_all(std::vector<StagedFile>& files);

}  // namespace shardlab
