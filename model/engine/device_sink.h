// DeviceSink: where the model's kernels report themselves on a virtual device.
// Each op charges the cost model on the compute stream (and appears in the
// trace); saved activations are charged to the arena while they live. One per device thread.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "model/sink.h"
#include "runtime/device.h"

namespace shardlab::engine {

class DeviceSink final : public model::OpSink {
 public:
  explicit DeviceSink(Device& dev) : dev_(dev) {}
  void op(const char* name, const OpCost& cost) override {
    if (cost.op_class != OpClass::kGemm) {
      dev_.run(dev_.compute(), name, cost);
      return;
    }
    const Time start = dev_.compute().now();
    if (gemm_ready_.empty()) {
      last_gemm_ = {start, dev_.run(dev_.compute(), name, cost)};
      return;
    }
    // split_next_gemm: chunk k of n is m/n rows (its operands' bytes and its
    // launch its own), started when its rows have arrived.
    const auto n = static_cast<int64_t>(gemm_ready_.size());
    OpCost chunk = cost;
    chunk.flops /= double(n);
    chunk.bytes /= double(n);
    chunk.gemm.m /= n;
    Time first = -1, end = start;
    for (const Time ready : gemm_ready_) {
      dev_.compute().wait({ready});
      if (first < 0) first = dev_.compute().now();
      end = dev_.run(dev_.compute(), name, chunk);
    }
    gemm_ready_.clear();
    last_gemm_ = {first, end};
  }
  void split_next_gemm(std::vector<Time> ready) override { gemm_ready_ = std::move(ready); }
  std::pair<Time, Time> last_gemm() const override { return last_gemm_; }
  void saved(int64_t elements) override {
    const uint64_t bytes = uint64_t(elements) * shardlab::element_size(dev_.precision());
    dev_.arena().allocate(bytes, MemKind::kActivation, "activations");
  }
  void freed(int64_t elements) override {
    dev_.arena().release(uint64_t(elements) * shardlab::element_size(dev_.precision()), MemKind::kActivation);
  }
  int element_size() const override { return shardlab::element_size(dev_.precision()); }
  bool fp8() const override { return dev_.precision() == Precision::kFp8; }
  model::KernelFusions fusions() const override { return fusions_; }
  void set_fusions(const model::KernelFusions& f) { fusions_ = f; }
  bool average_over_replicas(float* data, int64_t n) override {
    return average_ && average_(data, n);
  }
  // How to average over the data-parallel replicas (an all-reduce on the dp group).
  void on_average(std::function<bool(float*, int64_t)> f) { average_ = std::move(f); }
  void grads_ready(int64_t offset, int64_t count) override {
    if (on_grads_ready_) on_grads_ready_(offset, count);
  }
  void grads_partial(int64_t offset, int64_t count) override {
    if (on_grads_partial_) on_grads_partial_(offset, count);
  }
  // Without gradient accumulation fusion (Megatron-LM 2021's local DDP), in
  // mixed precision every micro-batch's weight gradients are added into the
  // fp32 main gradients by a separate elementwise kernel: read the
  // half-precision gradient, read and write the fp32 main gradient (bf16
  // main gradients, set_grad_bytes: 2 bytes each). Fused
  // (--gradient-accumulation-fusion, Megatron-LM 2022), the wgrad GEMM
  // accumulates into the main gradient itself, at no extra charge. With
  // half-precision gradients (ParallelOptions::half_grads) autograd keeps
  // the step's first gradient of `key` as it is and adds each later one in
  // half precision: read both, write one. Where data parallelism reduces
  // every micro-batch (ZeRO-3, set_copy_grads), nothing is accumulated
  // locally: each micro-batch's gradient is copied into the fp32 buffer
  // that is reduce-scattered (Megatron-FSDP: `param.main_grad.copy_(param.grad)`;
  // DeepSpeed's ZeRO-2 copies it into its reduction bucket), read one, write one.
  void grads_accumulated(int64_t key, int64_t count) override {
    if (dev_.precision() == Precision::kFp32 || count <= 0) return;
    if (half_) {
      if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) {
        seen_.push_back(key);
        return;
      }
      dev_.run(dev_.compute(), "grad_accum", half_grad_accum_cost(count, element_size()));
    } else if (!fused_) {
      dev_.run(dev_.compute(), "grad_accum",
               copy_ ? OpCost{double(count), double(count) * double(element_size() + grad_bytes_)}
                     : grad_accum_cost(count, element_size(), grad_bytes_));
    }
  }
  static OpCost grad_accum_cost(int64_t count, int elem, int grad = 4) {
    return {double(count), double(count) * double(elem + grad + grad)};
  }
  static OpCost half_grad_accum_cost(int64_t count, int elem) {
    return {double(count), double(count) * double(3 * elem)};
  }
  void set_grad_accum_fusion(bool fused) { fused_ = fused; }
  void set_half_grads(bool half) { half_ = half; }
  void set_copy_grads(bool copy) { copy_ = copy; }
  // Bytes of a main gradient: 4 (fp32), or 2 with --grad-reduce-in-bf16.
  void set_grad_bytes(int bytes) { grad_bytes_ = bytes; }
  // A new step: every parameter's next gradient is its first again.
  void begin_step() { seen_.clear(); }
  // Where final gradients are announced (data parallelism's buckets).
  void on_grads_ready(std::function<void(int64_t, int64_t)> f) { on_grads_ready_ = std::move(f); }
  // Where a non-final backward's finished gradients are announced (ZeRO-2).
  void on_grads_partial(std::function<void(int64_t, int64_t)> f) { on_grads_partial_ = std::move(f); }

 private:
  Device& dev_;
  bool fused_ = true;
  bool half_ = false;
  model::KernelFusions fusions_;
  bool copy_ = false;
  int grad_bytes_ = 4;
  std::vector<Time> gemm_ready_;        // split_next_gemm, until the next GEMM
  std::pair<Time, Time> last_gemm_{0, 0};
  std::vector<int64_t> seen_;  // keys with a gradient this step (half_grads); a few hundred at most
  std::function<void(int64_t, int64_t)> on_grads_ready_, on_grads_partial_;
  std::function<bool(float*, int64_t)> average_;
};

}  // namespace shardlab::engine
