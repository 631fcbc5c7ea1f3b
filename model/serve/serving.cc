#include "model/serve/serving.h"

#include <cmath>

#include "runtime/errors.h"

namespace shardlab::serve {

ServeResult simulate_serving(const std::vector<Request>& requests, const ServeOptions& o,
                             StepExecutor& executor) {
  SHARDLAB_CHECK(o.replicas > 0, "serving needs at least one replica");
  std::vector<std::vector<Request>> share(static_cast<size_t>(o.replicas));
  for (size_t i = 0; i < requests.size(); ++i) share[i % share.size()].push_back(requests[i]);
  ServeResult out;
  for (int r = 0; r < o.replicas; ++r)
    out.replicas.push_back(simulate_replica(share[size_t(r)], o.scheduler, executor, r));
  out.summary = summarize(out.replicas, o.scheduler.kv_blocks, o.scheduler.kv_block);
  return out;
}

int64_t kv_blocks_on_device(double capacity_bytes, double fraction, double weight_bytes,
                            double activation_bytes, double kv_bytes_per_token, int block) {
  SHARDLAB_CHECK(kv_bytes_per_token > 0 && block > 0, "KV bytes per token and block must be positive");
  const double room = capacity_bytes * fraction - weight_bytes - activation_bytes;
  if (!(room > 0)) return 0;
  return static_cast<int64_t>(std::floor(room / (kv_bytes_per_token * block)));
}

}  // namespace shardlab::serve
