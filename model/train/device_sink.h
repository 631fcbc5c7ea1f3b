// DeviceSink: where the model's kernels report themselves on a virtual device.
// Each op charges the cost model on the compute stream (and appears in the
// trace); saved activations are charged to the arena while they live.
#pragma once

#include "model/sink.h"
#include "runtime/device.h"

namespace shardlab::train {

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

 private:
  Device& dev_;
};

}  // namespace shardlab::train
