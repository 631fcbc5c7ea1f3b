#include "runtime/cost_model.h"

#include <algorithm>
#include <cmath>

namespace shardlab {

const char* precision_name(Precision p) { return p == Precision::kFp32 ? "fp32" : "bf16"; }
int element_size(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

CostModel::CostModel(const DeviceSpec& spec, Precision precision)
    : precision_(precision),
      peak_flops_((precision == Precision::kFp32 ? spec.peak_tflops_fp32 : spec.peak_tflops_bf16) * 1e12),
      achieved_flops_(peak_flops_ * spec.compute_efficiency),
      mem_bytes_per_s_(spec.mem_bandwidth_GBps * 1e9),
      launch_(us_to_time(spec.launch_overhead_us)) {}

Time CostModel::duration(const OpCost& op) const {
  const double compute_ps = op.flops > 0 ? std::ceil(op.flops / achieved_flops_ * 1e12) : 0.0;
  const double memory_ps = op.bytes > 0 ? std::ceil(op.bytes / mem_bytes_per_s_ * 1e12) : 0.0;
  return launch_ + static_cast<Time>(std::max(compute_ps, memory_ps));
}

}  // namespace shardlab
