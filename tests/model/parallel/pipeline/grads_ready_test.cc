// OpSink::grads_ready under pipeline schedules, fused and split backward:
// ShardedGPT driven by the PipelineExecutor on 2 pipeline ranks with a
// recording sink. Every local gradient element is announced exactly once per
// step (a per-element counter, so an overlap plus a gap cannot pass), except
// the tied wte, which the trainer announces after summing the two stages'
// copies; and what is announced is final: the values at the announcement
// equal the values at the end of the step, bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "collectives/group.h"
#include "model/config.h"
#include "model/parallel/pipeline/executor.h"
#include "model/parallel/pipeline/schedule.h"
#include "model/parallel/sharded_gpt.h"
#include "runtime/cluster.h"
#include "runtime/profile.h"
#include "support/compare.h"

namespace shardlab::parallel {
namespace {

// Charges the compute stream; counts the announcements of each element and
// snapshots the gradient values at that moment.
class AnnounceSink final : public model::OpSink {
 public:
  explicit AnnounceSink(Device& dev) : dev_(dev) {}
  void watch(std::span<const float> grads) {
    grads_ = grads;
    count.assign(grads.size(), 0);
    at_announce.assign(grads.size(), 0.0f);
  }
  void op(const char* name, const OpCost& cost) override { dev_.run(dev_.compute(), name, cost); }
  void grads_ready(int64_t offset, int64_t n) override {
    for (int64_t i = offset; i < offset + n; ++i) {
      if (i < 0 || i >= int64_t(count.size())) {
        ++outside;
        continue;
      }
      ++count[size_t(i)];
      at_announce[size_t(i)] = grads_[size_t(i)];
    }
  }
  std::vector<int> count;
  std::vector<float> at_announce;
  int64_t outside = 0;

 private:
  Device& dev_;
  std::span<const float> grads_;
};

model::GPTConfig config() {
  model::GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 64;
  return c;
}

struct RankCheck {
  std::vector<std::string> failures;  // per step
  std::vector<int64_t> announced;     // per step: elements announced
  int64_t elements = 0, wte = 0;
};

// Runs 2 steps of `schedule` (2 pipeline ranks, M micro-batches of 2 rows).
std::vector<RankCheck> run(const Schedule& schedule, int vpp, int M) {
  const model::GPTConfig cfg = config();
  const int rows = 2, T = cfg.block_size;
  std::vector<model::Token> tokens(size_t(M * rows * T));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int((i * 7 + 3) % size_t(cfg.vocab_size));
  std::vector<RankCheck> out(2);
  ClusterOptions o;
  o.world_size = 2;
  Cluster cluster(load_profile("a100-nvlink"), o);
  cluster.run([&](Device& dev) {
    const int r = dev.rank();
    const collectives::ProcessGroup tp({r}, r, "tp");
    ShardedOptions so;
    so.placement = {2, vpp, r, {}};
    ShardedGPT m(cfg, 1234, dev, {&tp}, so);
    m.set_micro_batch(rows, T);
    AnnounceSink sink(dev);
    m.set_sink(&sink);
    PipelineExecutor ex(dev, m, schedule[size_t(r)], {0, 1}, M);
    RankCheck& rc = out[size_t(r)];
    rc.elements = int64_t(m.grads().size());
    const Range wte = m.wte_range();
    rc.wte = wte.size;
    for (int step = 0; step < 2; ++step) {
      m.zero_grad();
      sink.watch(m.grads());
      ex.run([&](int mb) {
        const model::Token* x = tokens.data() + size_t(mb * rows * T);
        return MicroBatchTokens{x, x};  // targets: any valid tokens
      });
      std::string failure;
      int64_t announced = 0;
      for (int64_t i = 0; i < rc.elements && failure.empty(); ++i) {
        // wte: both stages hold a copy (embedding / head); the trainer sums
        // them over the embedding group and announces it, not the model.
        const int want = wte.contains(i) ? 0 : 1;
        if (sink.count[size_t(i)] != want)
          failure = "element " + std::to_string(i) + " announced " + std::to_string(sink.count[size_t(i)]) +
                    " times, want " + std::to_string(want);
        announced += sink.count[size_t(i)];
      }
      if (sink.outside > 0) failure += "; announcements outside the buffer";
      // Announced means final: nothing changes after the announcement.
      std::vector<float> then, now;
      for (int64_t i = 0; i < rc.elements; ++i) {
        if (sink.count[size_t(i)] == 0) continue;
        then.push_back(sink.at_announce[size_t(i)]);
        now.push_back(m.grads()[size_t(i)]);
      }
      const ::testing::AssertionResult final_values = shardlab::testing::all_close(then, now, 0.0);
      if (!final_values) failure += std::string("; changed after the announcement: ") + final_values.message();
      rc.failures.push_back(failure);
      rc.announced.push_back(announced);
    }
  });
  return out;
}

void expect_each_element_once(const Schedule& s, int vpp, int M, const char* what) {
  ASSERT_EQ(validate_schedule(s, M, vpp), "") << what;
  const std::vector<RankCheck> ranks = run(s, vpp, M);
  for (size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_EQ(ranks[r].failures.size(), 2u);
    ASSERT_GT(ranks[r].wte, 0) << "each of the 2 stages holds a copy of wte";
    for (int step = 0; step < 2; ++step) {
      std::printf("  %s rank %zu step %d: %lld of %lld elements announced once, wte (%lld) left to the trainer\n",
                  what, r, step, (long long)ranks[r].announced[size_t(step)], (long long)ranks[r].elements,
                  (long long)ranks[r].wte);
      EXPECT_EQ(ranks[r].failures[size_t(step)], "") << what << " rank " << r << " step " << step;
      EXPECT_EQ(ranks[r].announced[size_t(step)], ranks[r].elements - ranks[r].wte);
    }
  }
}

TEST(GradsReady, EveryElementOncePerStepUnderOneFOneB) {
  const Schedule fused = one_f_one_b(2, 4);
  expect_each_element_once(fused, 1, 4, "1f1b");
  expect_each_element_once(split_backward(fused, true), 1, 4, "1f1b, every W at the end");
  expect_each_element_once(split_backward(fused, false), 1, 4, "1f1b, W after each B");
}

TEST(GradsReady, EveryElementOncePerStepUnderInterleaving) {
  const Schedule fused = interleaved_1f1b(2, 4, 2);
  expect_each_element_once(fused, 2, 4, "interleaved");
  expect_each_element_once(split_backward(fused, true), 2, 4, "interleaved, every W at the end");
}

}  // namespace
}  // namespace shardlab::parallel
