// StageModel: what the pipeline executor (executor.h) drives on one rank — the
// chunks of the model this rank holds, one micro-batch at a time.
//
// Buffers are owned per (chunk, micro-batch) and per (chunk, buffer id):
//   activation_buffer(c, id)  where an activation is received; the forward
//                             of the action naming `id` consumes it
//   gradient_buffer(c, id)    where an output gradient is received; the
//                             backward naming `id` consumes it
//   output(c, mb)             the forward's output, alive until the backward
//                             of (c, mb) frees the activations
//   input_grad(c, mb)         the backward's input gradient, alive until
//                             release_input_grad(c, mb) (after the send)
// The schedule validator (schedule.h) checks a schedule against exactly
// these lifetimes, so a valid schedule never reads a buffer that another
// micro-batch overwrote.
//
// Backward is B (backward_input: every input gradient, the weight gradients
// too unless deferred) and W (backward_weight: the deferred weight
// gradients). `final` marks the last backward action of the chunk in the
// step: the chunk's gradients become final during it (data-parallel buckets
// are announced block by block, as backward reaches them).
#pragma once

#include <cstdint>

#include "model/kernels.h"
#include "model/parallel/pipeline/stage.h"

namespace shardlab::parallel {

// The tokens of one micro-batch on this rank (null where the stage needs none).
struct MicroBatchTokens {
  const model::Token* inputs = nullptr;
  const model::Token* targets = nullptr;
};

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual const StagePlacement& placement() const = 0;
  // Elements of one activation (or its gradient) between stages.
  virtual int64_t boundary_elements() const = 0;
  // Megatron's scatter/gather between stages: the boundary travels in this
  // many equal parts, each rank of a group sending and receiving its part
  // (boundary_part()), and gather_boundary(buffer) reassembles the received
  // buffer (an all-gather, on the compute stream). 1: whole.
  virtual int boundary_parts() const { return 1; }
  virtual int boundary_part() const { return 0; }
  virtual void gather_boundary(float* buffer) {}

  virtual float* activation_buffer(int chunk, int buffer) = 0;
  virtual float* gradient_buffer(int chunk, int buffer) = 0;

  // Forward of (chunk, mb): tokens on the first stage (inputs) and the last
  // (targets); elsewhere the input from activation_buffer(chunk, buffer).
  virtual void forward(int chunk, int mb, int buffer, const MicroBatchTokens& tokens) = 0;
  virtual const float* output(int chunk, int mb) = 0;
  // B of (chunk, mb), with the output gradient from gradient_buffer(chunk,
  // buffer) (the last stage starts from the loss); dloss scales the loss
  // (1/M). With defer_weight, the weight gradients wait for backward_weight.
  virtual void backward_input(int chunk, int mb, int buffer, float dloss, bool defer_weight,
                              bool final) = 0;
  virtual void backward_weight(int chunk, int mb, bool final) = 0;
  virtual const float* input_grad(int chunk, int mb) = 0;
  virtual void release_input_grad(int chunk, int mb) = 0;

  // Losses of the forwards since reset_losses(): CE summed over this rank's
  // last-stage micro-batches, MoE aux over its blocks.
  virtual void reset_losses() = 0;
  virtual double ce_sum() const = 0;
  virtual double aux_sum() const = 0;
};

// A model that is the whole pipeline on its own (one stage, one chunk): it
// never sends or receives, and its backward is fused (no W action). What it
// must provide: forward, backward_input and the losses.
class OneStageModel : public StageModel {
 public:
  const StagePlacement& placement() const final { return placement_; }
  int64_t boundary_elements() const final { return 0; }
  float* activation_buffer(int chunk, int buffer) final;
  float* gradient_buffer(int chunk, int buffer) final;
  const float* output(int chunk, int mb) final;
  void backward_weight(int chunk, int mb, bool final) final;
  const float* input_grad(int chunk, int mb) final;
  void release_input_grad(int chunk, int mb) final {}

 protected:
  explicit OneStageModel(StagePlacement placement) : placement_(std::move(placement)) {}

 private:
  StagePlacement placement_;
};

}  // namespace shardlab::parallel
