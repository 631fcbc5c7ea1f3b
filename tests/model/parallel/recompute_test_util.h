// What the recomputation tests share (recompute_test.cc,
// recompute_modules_test.cc): a run's activation peak, the check that a
// recomputing run has the bits of one without, and the check against the
// unsharded model's gradients (within 1e-5, printed).
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"

namespace shardlab::train::testing {

inline uint64_t activation_peak(const TrainResult& r, size_t rank) {
  return r.run.devices[rank].peak_by_kind[static_cast<size_t>(MemKind::kActivation)];
}

// Every step's loss and the final parameters, bit for bit.
inline void expect_same_bits(const TrainResult& a, const TrainResult& none, const std::string& what) {
  ASSERT_EQ(a.steps.size(), none.steps.size()) << what;
  for (size_t s = 0; s < a.steps.size(); ++s) EXPECT_EQ(a.steps[s].loss, none.steps[s].loss) << what << " step " << s;
  ASSERT_EQ(a.final_params.size(), none.final_params.size()) << what;
  EXPECT_EQ(std::memcmp(a.final_params.data(), none.final_params.data(), a.final_params.size() * sizeof(float)), 0)
      << what << ": parameters differ from no recomputation";
}

inline void expect_like_unsharded(const TrainResult& r, const TrainResult& unsharded, const model::GPTConfig& model,
                                  const std::string& what) {
  const VerifyResult v = compare_runs(r, unsharded, model::ParamTable(model), {.grads = true});
  std::printf("%s vs unsharded: param rel L2 %.2e, grad rel L2 %.2e (tol 1e-5)\n", what.c_str(), v.param_rel_l2,
              v.grad_rel_l2);
  EXPECT_TRUE(v.passed) << what;
  EXPECT_LE(v.grad_rel_l2, 1e-5) << what;
}

}  // namespace shardlab::train::testing
