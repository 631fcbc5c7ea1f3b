// The files the tool reads (--profile, --data, --init, --resume's shards,
// --fault @FILE, --workload, --prompt-file): opened in one place, so every
// one of them says the same thing, in one line, about a path that is not a
// readable file.
//
//   std::ifstream in = open_input("`workload` w.csv", path, "a CSV file");
//   const std::string text = read_input("--prompt-file p.txt", path, "a text file", 64 << 20);
//
// Errors are ConfigErrors "LABEL: no such file", "LABEL: is a directory, not
// KIND", "LABEL: cannot open (REASON)", "LABEL: larger than N bytes" and
// "LABEL: cannot read (REASON)". LABEL names the option field ("`data` \"d.bin\"", the
// library) or the flag (the tool) and the path, as the caller's other errors do.
#pragma once

#include <cstddef>
#include <fstream>
#include <string>
#include <string_view>

namespace shardlab {

// Opens `path` for reading (binary: no newline translation). `missing_hint`
// follows "no such file" (e.g. " (expected synthetic:NAME or a .bin file)").
std::ifstream open_input(std::string_view label, const std::string& path, std::string_view kind,
                         std::string_view missing_hint = {});

// The whole file, refused once more than `max_bytes` of it have come.
std::string read_input(std::string_view label, const std::string& path, std::string_view kind, size_t max_bytes);

}  // namespace shardlab
