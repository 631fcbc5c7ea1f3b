// The unsharded GPT as a LocalModel: every tensor whole on this rank (the
// reference of `verify`, and each replica under pure data parallelism).
#pragma once

#include "model/gpt.h"
#include "model/parallel/local_model.h"

namespace shardlab::parallel {

class UnshardedModel final : public LocalModel {
 public:
  UnshardedModel(const model::GPTConfig& config, uint64_t seed);

  float forward(const model::Token* inputs, const model::Token* targets, int B, int T) override {
    const float loss = gpt_.forward(inputs, targets, B, T);
    count_moe(static_cast<int64_t>(B) * T);
    return loss;
  }
  void backward() override { gpt_.backward(); }
  void backward_scaled(float dloss) override { gpt_.backward(dloss); }
  void zero_grad() override { gpt_.zero_grad(); }
  std::span<float> params() override { return gpt_.params(); }
  std::span<float> grads() override { return gpt_.grads(); }
  const std::vector<ShardSpec>& shards() const override { return shards_; }
  float ce_loss() const override { return gpt_.ce_loss(); }
  float aux_loss() const override { return gpt_.aux_loss(); }
  void set_sink(model::OpSink* sink) override { gpt_.set_sink(sink); }

  model::GPT<float>& gpt() { return gpt_; }

 private:
  // Adds the last forward's rows per expert and drops to moe_step_.
  void count_moe(int64_t N);

  model::GPT<float> gpt_;
  std::vector<ShardSpec> shards_;
};

// Whole-tensor shard specs for every tensor of a parameter table.
std::vector<ShardSpec> whole_tensor_shards(const model::ParamTable& table);

}  // namespace shardlab::parallel
