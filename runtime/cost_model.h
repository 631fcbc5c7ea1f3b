// Roofline cost model for compute ops on one virtual device.
//
//   duration = launch_overhead + max(flops / (peak * efficiency), bytes / mem_bandwidth)
//
// Each term is rounded up to a whole picosecond. `bytes` is the modeled
// traffic to device memory (reads + writes at the modeled element size).
#pragma once

#include <cstdint>

#include "runtime/profile.h"
#include "runtime/time.h"

namespace shardlab {

// Modeled precision: sets the element size and which peak applies. Host math
// is always fp32 (or fp64 in gradient-check tests).
enum class Precision : uint8_t { kFp32, kBf16 };
const char* precision_name(Precision p);
int element_size(Precision p);  // modeled bytes per element: 4 or 2

struct OpCost {
  double flops = 0;    // floating-point operations
  double bytes = 0;    // modeled bytes read + written in device memory
};

class CostModel {
 public:
  CostModel(const DeviceSpec& spec, Precision precision);

  Time duration(const OpCost& op) const;
  Time launch_overhead() const { return launch_; }
  double peak_flops() const { return peak_flops_; }  // FLOP/s at this precision, before efficiency
  Precision precision() const { return precision_; }

 private:
  Precision precision_;
  double peak_flops_;        // FLOP/s
  double achieved_flops_;    // FLOP/s = peak * efficiency
  double mem_bytes_per_s_;
  Time launch_;
};

}  // namespace shardlab
