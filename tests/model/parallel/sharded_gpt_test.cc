// ShardedGPT's hooks and buffers: BlockHooks see every block of the rank's
// chunks around its forward and backward, in order, the embeddings (-1) and
// the head (n_layer) on the stages that hold them; a receive buffer is the
// rank's own per (chunk, id).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/group.h"
#include "model/config.h"
#include "model/parallel/sharded_gpt.h"
#include "runtime/cluster.h"
#include "runtime/profile.h"
#include "tests/model/test_models.h"

namespace shardlab::parallel {
namespace {

model::GPTConfig config() {
  model::GPTConfig c = model::preset("tiny");
  c.n_layer = 4, c.n_embd = 32, c.n_head = 4, c.block_size = 8, c.vocab_size = 32, c.batch_size = 2;
  return c;
}

struct Recorder final : BlockHooks {
  std::vector<std::string> events;
  void before_forward(int l) override { events.push_back("f" + std::to_string(l)); }
  void after_forward(int l) override { events.push_back("F" + std::to_string(l)); }
  void before_backward(int l) override { events.push_back("b" + std::to_string(l)); }
  void after_backward(int l) override { events.push_back("B" + std::to_string(l)); }
};

// Runs f(device, its one-device group) on a 1-device cluster.
template <typename F>
void on_one_device(F&& f) {
  ClusterOptions o;
  o.world_size = 1;
  Cluster cluster(builtin_profiles().front(), o);
  cluster.run([&](Device& dev) {
    const collectives::ProcessGroup world = collectives::ProcessGroup::world(dev);
    f(dev, world);
  });
}

TEST(ShardedGPT, BlockHooksWrapEveryBlockInOrder) {
  Recorder hooks;
  on_one_device([&](Device& dev, const collectives::ProcessGroup& world) {
    const model::GPTConfig c = config();
    ShardedGPT m(c, 1, dev, {&world}, {.hooks = &hooks});
    const auto x = model::testing::random_tokens(1, 16, c.vocab_size), y = model::testing::random_tokens(2, 16, c.vocab_size);
    m.forward(x.data(), y.data(), 2, 8);
    m.backward();
  });
  EXPECT_EQ(hooks.events, (std::vector<std::string>{"f-1", "F-1", "f0", "F0", "f1", "F1", "f2", "F2", "f3", "F3",
                                                     "f4", "F4", "b4", "B4", "b3", "B3", "b2", "B2", "b1",
                                                     "B1", "b0", "B0", "b-1", "B-1"}));
}

TEST(ShardedGPT, AStageSeesOnlyItsBlocksAndOwnsItsReceiveBuffers) {
  Recorder hooks;
  on_one_device([&](Device& dev, const collectives::ProcessGroup& world) {
    const model::GPTConfig c = config();
    // Rank 1 of a 2-stage pipeline: blocks 2 and 3, ln_f and the head.
    ShardedGPT m(c, 1, dev, {&world}, {.placement = {2, 1, 1, {}}, .hooks = &hooks});
    m.set_micro_batch(2, 8);
    EXPECT_FALSE(m.placement().holds_first());
    EXPECT_TRUE(m.placement().holds_last());
    float* a0 = m.activation_buffer(0, 0);
    float* a1 = m.activation_buffer(0, 1);
    EXPECT_NE(a0, a1);
    EXPECT_EQ(a0, m.activation_buffer(0, 0));
    std::fill(a0, a0 + m.boundary_elements(), 0.01f);
    const auto y = model::testing::random_tokens(2, 16, c.vocab_size);
    m.forward(0, 0, 0, {nullptr, y.data()});
    m.backward_input(0, 0, 0, 1.0f, false, true);
    EXPECT_NE(m.input_grad(0, 0), nullptr);
    m.release_input_grad(0, 0);
  });
  EXPECT_EQ(hooks.events, (std::vector<std::string>{"f2", "F2", "f3", "F3", "f4", "F4", "b4", "B4", "b3", "B3",
                                                     "b2", "B2"}));
}

}  // namespace
}  // namespace shardlab::parallel
