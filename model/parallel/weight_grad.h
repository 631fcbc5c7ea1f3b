// WeightGrads: the W half of backward (weight gradients), run at once or later.
//
// Backward splits every linear layer into B, the input gradient that the
// previous layer (or pipeline stage) waits for, and W, the weight gradient
// that nothing downstream waits for (Qi et al., "Zero Bubble Pipeline
// Parallelism", 2024). The layers compute B themselves and hand each W to a
// WeightGrads:
//
//   immediate (the fused backward): W runs right away, on the same buffers,
//     so B-then-W is the old fused backward bit for bit;
//   deferred (a schedule with separate W actions): W is recorded with copies
//     of its two operands (the output gradient and the layer input) — the W
//     stash — and runs at flush(), in recording order, so the gradient
//     accumulation order, and therefore every bit, is the same.
//
// The stash is charged to the arena as activations while it lives (the
// memory a zero-bubble schedule pays to delay W); the W kernels charge the
// compute stream when they run. A layer input is one of the activations the
// backward still holds (PyTorch keeps the saved tensor alive rather than
// copying it): only the output gradients are new memory during B, and the
// inputs are charged once their block's activations are freed (charge_inputs).
// The host buffers are reused from step to step: no allocation in a steady state.
//
// Thread safety: one instance per (chunk, micro-batch) slot, on the device's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/buffer.h"
#include "model/sink.h"

namespace shardlab::parallel {

class WeightGrads {
 public:
  void set_deferred(bool deferred) { deferred_ = deferred; }
  bool deferred() const { return deferred_; }

  // dweight (OC,C) += doutᵀ·inp and dbias (OC) += column sums of dout (dbias
  // may be null), for dout (N,OC) and inp (N,C); charged as "<name>.wgrad".
  // `bias`: the layer has one (dbias may still be null in a phantom run).
  void linear(const char* name, float* dweight, float* dbias, bool bias, const float* dout,
              const float* inp, int64_t N, int C, int OC, const model::Exec& ex);
  // The weight gradients recorded since the last call belong to `layer` (a
  // block index, or any id the caller uses for the head): flush() reports it
  // once its weight gradients are done.
  void end_block(int layer);
  // Runs the recorded weight gradients in order; after each block's,
  // on_block(layer). Frees the stash.
  void flush(const model::Exec& ex, const std::function<void(int layer)>& on_block);
  // After B freed a block's activations: the layer inputs that
  // stay alive for W are charged now.
  void charge_inputs(const model::Exec& ex);
  // Elements held for the deferred weight gradients (the W stash).
  int64_t stash_elements() const { return modeled_; }
  bool empty() const { return tasks_.empty(); }

 private:
  struct Task {
    const char* name;
    float* dweight;
    float* dbias;
    bool bias;
    int64_t dout, inp;  // offsets into stash_
    int64_t N;
    int C, OC;
    int layer;  // -1 until end_block
    bool fp8;   // one of Transformer Engine's FP8 linears (Exec::fp8_linear)
    model::Exec::Grouped grouped;  // an expert's, in its group (Exec::grouped)
  };
  float* reserve(int64_t n, int64_t* offset);

  bool deferred_ = false;
  std::vector<Task> tasks_;
  model::Buffer<float> stash_;
  int64_t used_ = 0;     // host floats in stash_ (with alignment padding)
  int64_t modeled_ = 0;  // elements of the stash (charged to the arena by the end of B)
  int64_t inputs_uncharged_ = 0;  // layer inputs still counted as the backward's activations
};

}  // namespace shardlab::parallel
