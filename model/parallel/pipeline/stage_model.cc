#include "model/parallel/pipeline/stage_model.h"

#include "runtime/errors.h"

namespace shardlab::parallel {

float* OneStageModel::activation_buffer(int, int) {
  SHARDLAB_CHECK(false, "a one-stage model receives no activation");
  return nullptr;
}

float* OneStageModel::gradient_buffer(int, int) {
  SHARDLAB_CHECK(false, "a one-stage model receives no gradient");
  return nullptr;
}

const float* OneStageModel::output(int, int) {
  SHARDLAB_CHECK(false, "a one-stage model sends no activation");
  return nullptr;
}

void OneStageModel::backward_weight(int, int, bool) {
  SHARDLAB_CHECK(false, "this model has a fused backward only (no W action)");
}

const float* OneStageModel::input_grad(int, int) {
  SHARDLAB_CHECK(false, "a one-stage model sends no gradient");
  return nullptr;
}

}  // namespace shardlab::parallel
