// A step executor for the scheduler's tests: a step costs a + b per token
// processed, enough to compute by hand what the scheduler must produce. It
// keeps every batch it was asked to time, and the prefix cache's calls.
#pragma once

#include <span>
#include <vector>

#include "model/serve/scheduler.h"

namespace shardlab::serve {

struct LinearStep final : StepExecutor {
  double a = 1.0, b = 0.01;
  std::vector<std::vector<BatchEntry>> batches;
  std::vector<int32_t> cached, evicted;  // blocks, in call order
  StepOutcome run_step(std::span<const BatchEntry> batch) override {
    batches.emplace_back(batch.begin(), batch.end());
    int tokens = 0;
    for (const BatchEntry& e : batch) tokens += e.new_tokens;
    return {a + b * tokens, {}};
  }
  void cache_block(int, int64_t, int, int32_t block) override { cached.push_back(block); }
  void evict_block(int32_t block) override { evicted.push_back(block); }
};

}  // namespace shardlab::serve
