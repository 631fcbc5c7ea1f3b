#include "model/parallel/weight_grad.h"

#include <algorithm>
#include <cstring>

#include "model/kernels.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

namespace {

// Floats per alignment unit of model::Buffer (64 bytes).
constexpr int64_t kAlignFloats = model::kBufferAlignment / sizeof(float);

// A copy must start at the same offset inside a 64-byte line as its source:
// Eigen's summation order depends on it (model/buffer.h), and the deferred
// weight gradient has to match the immediate one bit for bit.
int64_t phase_of(const float* p) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % model::kBufferAlignment) / 4;
}

}  // namespace

float* WeightGrads::reserve(int64_t n, int64_t* offset) {
  *offset = used_;
  used_ += n;
  if (static_cast<int64_t>(stash_.size()) < used_) stash_.resize(static_cast<size_t>(used_));
  return stash_.data() + *offset;
}

void WeightGrads::linear(const char* name, float* dweight, float* dbias, bool bias,
                         const float* dout, const float* inp, int64_t N, int C, int OC,
                         const model::Exec& ex) {
  SHARDLAB_CHECK(!ex.math() || (dbias != nullptr) == bias, "a bias gradient needs a bias");  // phantom: no buffers
  if (!deferred_) {
    model::linear_backward_weight(ex, name, bias, dweight, dbias, dout, inp, N, C, OC);
    return;
  }
  Task t{name, dweight, dbias, bias, 0, 0, N, C, OC, -1, ex.fp8_linear, ex.grouped};
  int64_t pad = 0;
  auto copy = [&](const float* src, int64_t n, int64_t* at) {
    // Pad so that the copy has the source's phase in its 64-byte line.
    pad = (phase_of(src) - used_ % kAlignFloats + kAlignFloats) % kAlignFloats;
    int64_t ignored;
    if (pad > 0) reserve(pad, &ignored);
    std::memcpy(reserve(n, at), src, static_cast<size_t>(n) * sizeof(float));
  };
  if (ex.math()) {  // a handover (sink.h): the stash is charged below as modeled bytes, phantom or not
    copy(dout, N * OC, &t.dout);
    copy(inp, N * C, &t.inp);
  }
  tasks_.push_back(t);
  modeled_ += N * (OC + C);
  inputs_uncharged_ += N * C;
  if (ex.sink) ex.sink->saved(N * OC);
}

void WeightGrads::charge_inputs(const model::Exec& ex) {
  if (ex.sink && inputs_uncharged_ > 0) ex.sink->saved(inputs_uncharged_);
  inputs_uncharged_ = 0;
}

void WeightGrads::end_block(int layer) {
  for (auto it = tasks_.rbegin(); it != tasks_.rend() && it->layer < 0; ++it) it->layer = layer;
}

void WeightGrads::flush(const model::Exec& ex, const std::function<void(int layer)>& on_block) {
  for (size_t i = 0; i < tasks_.size(); ++i) {
    const Task& t = tasks_[i];
    model::Exec e = ex;
    e.fp8_linear = t.fp8;  // as the layer's B ran it
    e.grouped = t.grouped;
    // A phantom run stashed nothing: the stash's null data, offsets 0.
    model::linear_backward_weight(e, t.name, t.bias, t.dweight, t.dbias, stash_.data() + t.dout,
                                  stash_.data() + t.inp, t.N, t.C, t.OC);
    const bool block_done = i + 1 == tasks_.size() || tasks_[i + 1].layer != t.layer;
    if (block_done && on_block) on_block(t.layer);
  }
  // Inputs never charged (a flush before charge_inputs) were never counted here.
  if (ex.sink && modeled_ - inputs_uncharged_ > 0) ex.sink->freed(modeled_ - inputs_uncharged_);
  tasks_.clear();
  used_ = modeled_ = inputs_uncharged_ = 0;
}

}  // namespace shardlab::parallel
