// field_flags.h: the library's backquoted option fields shown as the tool's flags.
#include "cli/field_flags.h"

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
}

}  // namespace
}  // namespace shardlab::cli
