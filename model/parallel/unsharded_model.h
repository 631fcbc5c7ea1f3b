// The unsharded GPT (model/gpt.h, the hand-written reference) as a LocalModel
// and a one-stage StageModel: every tensor whole on this rank. It is the
// reference of `verify` and each replica under pure data parallelism, run by
// the same pipeline executor as every sharded model (its schedule is forward,
// backward per micro-batch). Its backward is fused: it has no separate weight
// gradient pass, so schedules that split B and W need the sharded model.
#pragma once

#include "model/gpt.h"
#include "model/parallel/local_model.h"
#include "model/parallel/pipeline/stage_model.h"

namespace shardlab::parallel {

class UnshardedModel final : public LocalModel, public OneStageModel {
 public:
  UnshardedModel(const model::GPTConfig& config, uint64_t seed);

  // LocalModel.
  float forward(const model::Token* inputs, const model::Token* targets, int B, int T) override;
  void backward() override { gpt_.backward(); }
  void backward_scaled(float dloss) override { gpt_.backward(dloss); }
  void zero_grad() override { gpt_.zero_grad(); }
  void free_host_buffers() override { gpt_.free_buffers(); }
  std::span<float> params() override { return gpt_.params(); }
  std::span<float> grads() override { return gpt_.grads(); }
  const std::vector<ShardSpec>& shards() const override { return shards_; }
  float ce_loss() const override { return gpt_.ce_loss(); }
  float aux_loss() const override { return gpt_.aux_loss(); }
  void set_sink(model::OpSink* sink) override;

  // StageModel: one stage, one micro-batch (rows B, time T) in flight at a time.
  void set_micro_batch(int B, int T) { B_ = B, T_ = T; }
  void forward(int chunk, int mb, int buffer, const MicroBatchTokens& tokens) override;
  void backward_input(int chunk, int mb, int buffer, float dloss, bool defer_weight,
                      bool final) override;
  void reset_losses() override { ce_sum_ = aux_sum_ = 0; }
  double ce_sum() const override { return ce_sum_; }
  double aux_sum() const override { return aux_sum_; }

  model::GPT<float>& gpt() { return gpt_; }

 private:
  // Forwards everything to the device's sink, but gradients are announced
  // final only during the step's last backward (partial before it).
  class GatedSink final : public model::OpSink {
   public:
    model::OpSink* target = nullptr;
    bool open = true;
    void op(const char* name, const OpCost& cost) override { target->op(name, cost); }
    void saved(int64_t n) override { target->saved(n); }
    void freed(int64_t n) override { target->freed(n); }
    void grads_ready(int64_t offset, int64_t count) override {
      target->grads_accumulated(offset, count);  // every micro-batch (the GPT announces each range once)
      if (open)
        target->grads_ready(offset, count);
      else
        target->grads_partial(offset, count);
    }
    bool average_over_replicas(float* data, int64_t n) override {
      return target->average_over_replicas(data, n);
    }
    int element_size() const override { return target->element_size(); }
    model::KernelFusions fusions() const override { return target->fusions(); }
  };
  // Adds the last forward's rows per expert and drops to moe_step_.
  void count_moe(int64_t N);

  model::GPT<float> gpt_;
  std::vector<ShardSpec> shards_;
  GatedSink gate_;
  int B_ = 0, T_ = 0;
  int in_flight_ = -1;  // the micro-batch between forward and backward
  double ce_sum_ = 0, aux_sum_ = 0;
};

// Whole-tensor shard specs for every tensor of a parameter table.
std::vector<ShardSpec> whole_tensor_shards(const model::ParamTable& table);

}  // namespace shardlab::parallel
