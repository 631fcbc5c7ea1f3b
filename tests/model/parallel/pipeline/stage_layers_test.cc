// --pp-layers: parse_stage_layers and check_stage_layers (stage.h), with
// the inputs fuzzing found (fuzz/pp_layers_fuzz.cc, fuzz/corpus/pp_layers).
#include "model/parallel/pipeline/stage.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/errors.h"

namespace shardlab::parallel {
namespace {

std::string check_error(const std::vector<int>& layers, int n_layer) {
  model::GPTConfig config;
  config.n_layer = n_layer;
  try {
    check_stage_layers(config, static_cast<int>(layers.size()), 1, layers);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(StageLayers, ParsesCommaSeparatedCounts) {
  EXPECT_EQ(parse_stage_layers("3,3,2"), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(parse_stage_layers("8"), (std::vector<int>{8}));
  for (const char* bad : {"", "3,,2", "4,4,", "a", "3,x", "99999999999,1"}) {
    EXPECT_THROW(parse_stage_layers(bad), ConfigError) << bad;
  }
}

// Found by fuzzing: counts whose sum overflows int were summed in int (UB,
// and a wrong sum in the message). The sum is now exact.
TEST(StageLayers, SumOfHugeCountsDoesNotOverflow) {
  EXPECT_EQ(check_error(parse_stage_layers("999999999,1999999999,1"), 8),
            "`stage_layers` sums to 2999999999 but the model has `n_layer` 8");
  EXPECT_EQ(check_error({2147483647, 2147483647}, 4), "`stage_layers` sums to 4294967294 but the model has `n_layer` 4");
  EXPECT_EQ(check_error({3, 3, 2}, 8), "no error");
}

// The first and the last stage may hold no block (only the embedding, only
// the head); a stage between them may not.
TEST(StageLayers, OnlyTheEndStagesMayBeEmpty) {
  EXPECT_EQ(check_error({0, 4, 4, 0}, 8), "no error");
  EXPECT_EQ(check_error({8, 0}, 8), "no error");
  EXPECT_EQ(check_error({4, 0, 4}, 8), "`stage_layers`: every stage but the first and the last needs at least one block");
  EXPECT_EQ(check_error({9, -1}, 8), "`stage_layers`: a stage cannot hold a negative number of blocks");
  // Two stages more than blocks only when both ends are empty.
  EXPECT_EQ(check_error({0, 1, 1, 0}, 2), "no error");
}

}  // namespace
}  // namespace shardlab::parallel
