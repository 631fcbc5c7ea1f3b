// The modern-MoE verify matrix (ctest label `full`, make test-full): every
// router (softmax or sigmoid scores, top-k gates normalized or raw) under
// every parallelism and the 5D mix, fine-grained top-8 with shared experts.
#include <vector>

#include "moe_modern_verify.h"

namespace shardlab::train::testing {
namespace {

std::vector<ModernCase> matrix() {
  const ParallelCase parallelisms[] = {
      {"tp2", 2},
      {"tp2_sp", 2, 1, 1, 1, 1, 1, 0, true},
      {"dp2", 1, 2},
      {"dp4_zero2", 1, 4, 1, 1, 1, 1, 2},
      {"ep2_dp2", 1, 2, 1, 2},
      {"ep4_dp4_tp2", 2, 4, 1, 4},
      {"pp2", 1, 1, 2, 1, 1, 2},
      {"cp2", 1, 1, 1, 1, 2},
      {"cp2_ep2_dp2", 1, 2, 1, 2, 2},
      {"tp2_cp2_ep2_dp4_pp2", 2, 4, 2, 2, 2, 2, 0, true},
  };
  std::vector<ModernCase> out;
  for (const ParallelCase& p : parallelisms)
    for (const RouterCase& r : kRouters) out.push_back({p, r});
  return out;
}

class ModernMoeFull : public ::testing::TestWithParam<ModernCase> {};

TEST_P(ModernMoeFull, MatchesTheUnshardedModel) { expect_matches_unsharded(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Matrix, ModernMoeFull, ::testing::ValuesIn(matrix()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace shardlab::train::testing
