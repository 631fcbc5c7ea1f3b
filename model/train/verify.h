// verify: does a sharded run match the unsharded one, number by number?
//
// Compares the loss of every step, and after the last step every parameter
// gathered from its shards (optionally the step-0 gradients too), against the
// unsharded reference trained from the same seed and batches.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/params.h"
#include "model/train/trainer.h"

namespace shardlab::train {

// Tolerances. Parameters (and gradients) are compared as one vector over the
// whole model: ||sharded - reference|| / ||reference|| <= tol_param. Single
// tensors are not held to it one by one: AdamW divides each gradient by its
// own RMS, so tensors whose true gradient is ~0 (the key bias of attention,
// rare tokens' embeddings) turn fp32 reduction noise into relative noise of
// 1e-4 on values near zero, in PyTorch as here. A tensor is named as the
// mismatch when its own difference alone exceeds tol_param * ||reference||.
struct VerifyOptions {
  double tol_loss = 1e-5;   // per-step relative loss difference
  double tol_param = 1e-5;  // relative L2 difference of the whole parameter vector
  bool grads = false;       // also compare the step-0 gradients
};

struct TensorDiff {
  std::string name;
  int layer = -1;
  double max_abs = 0;   // max |sharded - reference|
  int64_t argmax = 0;   // flat index of that element inside the tensor
  double rel_l2 = 0;    // ||sharded - reference|| / ||reference|| of this tensor
  double diff_l2 = 0;   // ||sharded - reference||
  double ref_l2 = 0;    // ||reference||
};

struct Mismatch {
  std::string kind;  // "loss", "grad", "param" or "replica" (dp copies differ)
  std::string name;  // tensor name (grad/param)
  int layer = -1;
  int step = -1;     // loss
  double value = 0;  // the relative difference that broke the tolerance
  double max_abs = 0;
};

struct VerifyResult {
  bool passed = true;
  std::vector<double> sharded_loss, reference_loss, loss_rel_diff;  // (steps)
  double max_loss_rel_diff = 0;
  std::vector<TensorDiff> params, grads;
  double max_param_abs_diff = 0;
  double param_rel_l2 = 0;  // whole parameter vector
  double grad_rel_l2 = 0;   // whole step-0 gradient vector, with grads
  std::optional<Mismatch> first_mismatch;
};

// Compares two runs of the same model (table) under `options`.
VerifyResult compare_runs(const TrainResult& sharded, const TrainResult& reference,
                          const model::ParamTable& table, const VerifyOptions& options);

nlohmann::json verify_json(const VerifyResult& r);

}  // namespace shardlab::train
