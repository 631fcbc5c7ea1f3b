#include "model/train/share_result.h"

#include "runtime/transport.h"
#include "runtime/wire.h"

namespace shardlab::train {
namespace {

template <class T>
void put_vector(wire::Writer& w, const std::vector<T>& v) {
  w.put<uint64_t>(v.size()).put_bytes(v.data(), v.size() * sizeof(T));
}

template <class T>
std::vector<T> get_vector(wire::Reader& r) {
  std::vector<T> v(r.get<uint64_t>());
  if (!v.empty()) std::memcpy(v.data(), r.take(v.size() * sizeof(T)), v.size() * sizeof(T));
  return v;
}

void put_moe(wire::Writer& w, const std::vector<MoeLayerTotals>& layers) {
  w.put<uint64_t>(layers.size());
  for (const MoeLayerTotals& m : layers) {
    w.put<int32_t>(m.layer).put<int32_t>(m.expert_begin).put(m.dropped).put(m.a2a_sent_bytes).put(m.a2a_recv_bytes);
    w.put<uint64_t>(m.per_step.size());
    for (const auto& step : m.per_step) put_vector(w, step);
  }
}

std::vector<MoeLayerTotals> get_moe(wire::Reader& r) {
  std::vector<MoeLayerTotals> layers(r.get<uint64_t>());
  for (MoeLayerTotals& m : layers) {
    m.layer = r.get<int32_t>();
    m.expert_begin = r.get<int32_t>();
    m.dropped = r.get<int64_t>();
    m.a2a_sent_bytes = r.get<uint64_t>();
    m.a2a_recv_bytes = r.get<uint64_t>();
    m.per_step.resize(r.get<uint64_t>());
    for (auto& step : m.per_step) step = get_vector<int64_t>(r);
  }
  return layers;
}

// The per-device rows of the devices this process ran, to everyone.
void share_rows(Transport& t, TrainResult& r, const std::vector<int>& owners) {
  wire::Writer w;
  for (size_t d = 0; d < owners.size(); ++d) {
    if (owners[d] != t.process()) continue;
    w.put<uint64_t>(d);
    put_vector(w, r.phases[d]);
    put_vector(w, r.first_step_spans[d]);
    put_moe(w, r.moe[d]);
  }
  for (const std::string& s : t.exchange(w.str())) {
    wire::Reader in(s);
    while (in.left() > 0) {
      const auto d = in.get<uint64_t>();
      r.phases[d] = get_vector<PhaseRecord>(in);
      r.first_step_spans[d] = get_vector<parallel::ComputeSpan>(in);
      r.moe[d] = get_moe(in);
    }
  }
}

}  // namespace

void share_train_result(TrainResult& r, const std::vector<int>& owners) {
  Transport* t = process_transport();
  if (!t) return;
  share_rows(*t, r, owners);
  // Element-wise disjoint writes (or equal values) into zeroed buffers.
  for (auto& replica : r.replicas) merge_disjoint(replica);
  merge_disjoint(r.step0_grads);
  merge_disjoint(r.tied_copy);
  merge_disjoint(r.a2a_time);
  merge_disjoint(r.fsdp);
  merge_disjoint(r.cp);
  // Device 0 (the leader's) wrote the step records and the loop's wall time.
  wire::Writer w;
  put_vector(w, r.steps);
  w.put(r.loop_wall_s);
  const std::string leader = t->exchange(t->process() == 0 ? w.str() : std::string()).front();
  wire::Reader in(leader);
  r.steps = get_vector<StepRecord>(in);
  r.loop_wall_s = in.get<double>();
}

}  // namespace shardlab::train
