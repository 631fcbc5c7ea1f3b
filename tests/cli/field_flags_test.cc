// field_flags.h: the library's backquoted option fields shown as the tool's flags.
#include "cli/field_flags.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace shardlab::cli {
namespace {

TEST(FieldFlags, KnownFieldsBecomeFlagsTheRestStays) {
  EXPECT_EQ(with_flag_names("`vpp` 1: `schedule` zb-v places exactly 2 model chunks per rank (a V); use `vpp` 2"),
            "--vpp 1: --schedule zb-v places exactly 2 model chunks per rank (a V); use --vpp 2");
  EXPECT_EQ(with_flag_names("`stage_layers` sums to 9 but the model has `n_layer` 8"),
            "--pp-layers sums to 9 but the model has --layers 8");
  EXPECT_EQ(with_flag_names("no fields here"), "no fields here");
  EXPECT_EQ(with_flag_names("`not_a_field` stays, `pp` does not"), "`not_a_field` stays, --pp does not");
  EXPECT_EQ(with_flag_names("an unmatched ` quote and `pp"), "an unmatched ` quote and `pp");
  EXPECT_EQ(with_flag_names(""), "");
  EXPECT_EQ(with_flag_names("`n_kv_head` 3 must divide `n_head` 4"), "--kv-heads 3 must divide --heads 4");
  EXPECT_EQ(with_flag_names("`rope_theta`, `norm_eps`, `n_expert`, `family`"),
            "--rope-theta, --norm-eps, --experts, --family");
  EXPECT_EQ(with_flag_names("`GPTConfig::top_k` 5, `top_k` 3, `prefetch = false`, `faults` dead:1"),
            "--moe-top-k 5, --top-k 3, --no-prefetch, --fault dead:1");
}

// Every string literal of the library (model/, runtime/, collectives/) that
// names an option field names one the tool can show as a flag, and none
// names a flag itself: the user sees flags, a C++ or Python user fields.
TEST(FieldFlags, LibraryMessagesNameMappedFieldsNotFlags) {
  const std::regex literal(R"re("((?:[^"\\]|\\.)*)")re"), field("`([A-Za-z_:. =]+)`"), flag("--[a-z]");
  int fields = 0, files = 0;
  for (const char* dir : {"model", "runtime", "collectives"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(SHARDLAB_SOURCE_DIR) + "/" + dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cc" && ext != ".h") continue;
      ++files;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        const size_t code = line.find_first_not_of(" \t");
        if (code == std::string::npos || line.compare(code, 2, "//") == 0) continue;
        const std::string where = e.path().string() + ":" + std::to_string(n);
        for (std::sregex_iterator m(line.begin(), line.end(), literal), end; m != end; ++m) {
          const std::string text = (*m)[1];
          EXPECT_FALSE(std::regex_search(text, flag)) << where << ": a library message names a flag: " << text;
          for (std::sregex_iterator f(text.begin(), text.end(), field); f != end; ++f, ++fields) {
            const std::string quoted = (*f)[0];
            EXPECT_NE(with_flag_names(quoted), quoted) << where << ": " << quoted << " has no flag in field_flags.cc";
          }
        }
      }
    }
  }
  std::printf("%d backquoted fields in the string literals of %d library files, each with its flag\n", fields, files);
  EXPECT_GT(fields, 100);  // the scan found the messages (about 200 today)
}

}  // namespace
}  // namespace shardlab::cli
