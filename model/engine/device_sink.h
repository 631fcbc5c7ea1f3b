// DeviceSink: where the model's kernels report themselves on a virtual device.
// Each op charges the cost model on the compute stream (and appears in the
// trace); saved activations are charged to the arena while they live.
#pragma once

#include <functional>

#include "model/sink.h"
#include "runtime/device.h"

namespace shardlab::engine {

class DeviceSink final : public model::OpSink {
 public:
  explicit DeviceSink(Device& dev) : dev_(dev) {}
  void op(const char* name, const OpCost& cost) override { dev_.run(dev_.compute(), name, cost); }
  void saved(int64_t elements) override {
    const uint64_t bytes = uint64_t(elements) * shardlab::element_size(dev_.precision());
    dev_.arena().allocate(bytes, MemKind::kActivation, "activations");
  }
  void freed(int64_t elements) override {
    dev_.arena().release(uint64_t(elements) * shardlab::element_size(dev_.precision()), MemKind::kActivation);
  }
  int element_size() const override { return shardlab::element_size(dev_.precision()); }
  bool average_over_replicas(float* data, int64_t n) override {
    return average_ && average_(data, n);
  }
  // How to average over the data-parallel replicas (an all-reduce on the dp group).
  void on_average(std::function<bool(float*, int64_t)> f) { average_ = std::move(f); }
  void grads_ready(int64_t offset, int64_t count) override {
    if (on_grads_ready_) on_grads_ready_(offset, count);
  }
  // Where final gradients are announced (data parallelism's buckets).
  void on_grads_ready(std::function<void(int64_t, int64_t)> f) { on_grads_ready_ = std::move(f); }

 private:
  Device& dev_;
  std::function<void(int64_t, int64_t)> on_grads_ready_;
  std::function<bool(float*, int64_t)> average_;
};

}  // namespace shardlab::engine
