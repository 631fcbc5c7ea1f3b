// The library's error messages name the option fields they are about in
// backquotes ("`vpp` 1: `schedule` zb-v places exactly 2 model chunks per
// rank"), as a C++ user sets them; the tool shows its own flags instead
// ("--vpp 1: --schedule zb-v ..."). One table maps a field to its flag.
#pragma once

#include <string>
#include <string_view>

namespace shardlab::cli {

// `message` with every backquoted field of the table replaced by its flag;
// any other backquoted text is left as it is.
std::string with_flag_names(std::string_view message);

// CLI11's words for a value given to an on/off flag (`--no-overlap=yes`:
// "no-overlap was given a disallowed flag override") name no fix: this says
// the flag takes none. Any other message comes back as it is.
std::string with_flag_hint(std::string_view message);

}  // namespace shardlab::cli
