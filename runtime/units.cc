#include "runtime/units.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/parse_number.h"

namespace shardlab {

uint64_t parse_bytes(std::string_view text, std::string_view flag) {
  auto fail = [&] { throw ConfigError(fmt::format("{}: cannot parse size \"{}\" (e.g. 8, 64K, 256MiB)", flag, text)); };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) fail();
  const std::optional<double> number = parse_number<double>(text.substr(0, i));  // digits and dots: no sign
  if (!number) fail();
  const double value = *number;
  std::string suffix(text.substr(i));
  double mult = 0;
  if (suffix.empty() || suffix == "B") mult = 1;
  const char* units = "KMGT";
  for (int k = 0; k < 4; ++k) {
    std::string u(1, units[k]);
    if (suffix == u || suffix == u + "iB" || suffix == std::string(1, static_cast<char>(std::tolower(units[k]))))
      mult = std::pow(1024.0, k + 1);
    if (suffix == u + "B") mult = std::pow(1000.0, k + 1);
  }
  if (mult == 0) fail();
  double bytes = value * mult;
  if (bytes != std::floor(bytes) || bytes > 9.0e18) fail();
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int k = -1;
  while (v >= 1024 && k < 3) { v /= 1024; ++k; }
  return fmt::format("{:.1f} {}", v, units[k]);
}

}  // namespace shardlab
