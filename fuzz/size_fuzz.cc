// The size parsers: parse_bytes (runtime/units.h), as --memory uses it, and
// the CLI's --min-bytes/--max-bytes pair (parse_size_range, cli.h). The input
// is the text of a --memory value; split at its first newline, the two
// halves are --min-bytes and --max-bytes.
#include <algorithm>
#include <string>

#include "cli/cli.h"
#include "fuzz/fuzz_util.h"
#include "runtime/errors.h"
#include "runtime/units.h"

namespace {

using shardlab::fuzz::finding;

// An accepted size reads back from its decimal form, and a plain count of
// up to 15 digits (exact in a double) is that count.
void check_size(const std::string& text, uint64_t bytes) {
  uint64_t again = 0;
  try {
    again = shardlab::parse_bytes(std::to_string(bytes), "--memory");
  } catch (const shardlab::ConfigError& e) {
    finding(std::string("the decimal form of an accepted size is refused: ") + e.what());
  }
  if (again != bytes) finding("the decimal form of an accepted size reads back differently");
  const bool plain = !text.empty() && text.size() <= 15 &&
                     std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (plain && bytes != std::stoull(text)) finding("a plain count parsed to another number");
  (void)shardlab::format_bytes(bytes);  // must not crash for any size
}

void check_range(const std::string& min_text, const std::string& max_text) {
  try {
    const auto [lo, hi] = shardlab::cli::parse_size_range(min_text, max_text);
    if (lo < 1 || lo > hi || hi > (uint64_t{4} << 30)) finding("parse_size_range accepted a bad range");
    if (lo != shardlab::parse_bytes(min_text, "--min-bytes") ||
        hi != shardlab::parse_bytes(max_text, "--max-bytes"))
      finding("parse_size_range differs from parse_bytes");
  } catch (const shardlab::ConfigError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(shardlab::fuzz::as_text(data, size));
  try {
    check_size(text, shardlab::parse_bytes(text, "--memory"));
  } catch (const shardlab::ConfigError&) {
    // Not a size: the expected outcome, one line naming the flag.
  }
  const size_t newline = text.find('\n');
  if (newline != std::string::npos) check_range(text.substr(0, newline), text.substr(newline + 1));
  return 0;
}
