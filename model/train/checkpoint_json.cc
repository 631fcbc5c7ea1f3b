#include "model/train/checkpoint_json.h"

#include <fmt/format.h>

#include "model/train/device_program.h"
#include "model/train/device_setup.h"
#include "runtime/errors.h"

namespace shardlab::train {

using parallel::ShardSpec;

nlohmann::json shard_entry(const ShardSpec& s, const char* state, const std::string& file, const std::string& key,
                           int64_t begin, int64_t end) {
  nlohmann::json ranges = nlohmann::json::array();
  for (const Range& r : s.ranges) ranges.push_back({r.begin, r.size});
  return {{"tensor", s.name},         {"state", state},           {"file", file},
          {"key", key},               {"split_dim", s.split_dim}, {"ranges", ranges},
          {"local_shape", s.local_shape}, {"flat_range", {begin, end}}};
}

ShardSpec shard_of_entry(const nlohmann::json& e, const Shape& global) {
  ShardSpec s;
  s.name = e.at("tensor").get<std::string>();
  s.global_shape = global;
  s.local_shape = e.at("local_shape").get<Shape>();
  s.split_dim = integer_field<int>(e.at("split_dim"), "split_dim", -1, 64);
  for (const auto& r : e.at("ranges"))
    s.ranges.push_back({count_field<int64_t>(r.at(0), "a range's start"), count_field<int64_t>(r.at(1), "a range's size")});
  auto require = [&](bool ok, const char* what) {
    if (!ok) throw ConfigError(fmt::format("shard of \"{}\": {}", s.name, what));
  };
  require(s.local_shape.size() == global.size(), "local_shape has another rank than the tensor");
  require(s.split_dim >= -1 && s.split_dim < int(global.size()), "split_dim out of range");
  int64_t along = 0;
  for (const Range& r : s.ranges) {
    require(r.begin >= 0 && r.size > 0 && s.split_dim >= 0 && r.end() <= global[size_t(s.split_dim)],
            "a range lies outside the tensor");
    along += r.size;
  }
  for (size_t d = 0; d < global.size(); ++d)
    require(int(d) == s.split_dim ? along == s.local_shape[d] : s.local_shape[d] == global[d],
            "local_shape does not match its ranges");
  s.numel = shape_numel(s.local_shape);
  return s;
}

nlohmann::json device_entry(DeviceSetup& s, Device& dev) {
  const Stream& c = dev.compute();
  const Stream& m = dev.comm();
  nlohmann::json egress = nlohmann::json::array(), ingress = nlohmann::json::array(), peaks = nlohmann::json::array();
  for (int p = 0; p < kNumLinkClasses; ++p) egress.push_back(dev.egress(p).latest()), ingress.push_back(dev.ingress(p).latest());
  for (int k = 0; k < kNumMemKinds; ++k) peaks.push_back(dev.arena().peak(static_cast<MemKind>(k)));
  return {{"name", s.ctx.mesh().describe(dev.rank())},
          {"clock", {{"compute_ps", c.now()}, {"comm_ps", m.now()}, {"egress_free_ps", egress}, {"ingress_free_ps", ingress}}},
          {"stats",
           {{"compute_busy_ps", c.busy()}, {"comm_busy_ps", m.busy()},
            {"comm_exposed_ps", m.busy() - overlap(c.intervals(), m.intervals())},
            {"compute_transfer_ps", c.transfer_busy()}, {"compute_flops", c.flops()},
            {"peak_bytes", dev.arena().peak()}, {"peak_bytes_by_kind", peaks}}}};
}

DeviceClock clock_of_entry(const nlohmann::json& d) {
  const nlohmann::json& c = d.at("clock");
  DeviceClock out{count_field<Time>(c.at("compute_ps"), "compute_ps"), count_field<Time>(c.at("comm_ps"), "comm_ps")};
  for (int p = 0; p < kNumLinkClasses; ++p) {
    out.egress[p] = count_field<Time>(c.at("egress_free_ps").at(size_t(p)), "egress_free_ps");
    out.ingress[p] = count_field<Time>(c.at("ingress_free_ps").at(size_t(p)), "ingress_free_ps");
  }
  return out;
}

DeviceStats stats_of_entry(const nlohmann::json& d, int rank) {
  const nlohmann::json& s = d.at("stats");
  DeviceStats out;
  out.rank = rank;
  out.compute_busy = count_field<Time>(s.at("compute_busy_ps"), "compute_busy_ps");
  out.comm_busy = count_field<Time>(s.at("comm_busy_ps"), "comm_busy_ps");
  out.comm_exposed = count_field<Time>(s.at("comm_exposed_ps"), "comm_exposed_ps");
  out.compute_transfer = count_field<Time>(s.at("compute_transfer_ps"), "compute_transfer_ps");
  out.compute_flops = s.at("compute_flops").get<double>();
  out.peak_bytes = count_field<uint64_t>(s.at("peak_bytes"), "peak_bytes");
  for (int k = 0; k < kNumMemKinds; ++k)
    out.peak_by_kind[k] = count_field<uint64_t>(s.at("peak_bytes_by_kind").at(size_t(k)), "peak_bytes_by_kind");
  return out;
}

namespace {

nlohmann::json step_entry(const StepRecord& r) {
  return {{"step", r.step}, {"loss", r.loss}, {"ce", r.ce}, {"aux", r.aux}, {"lr", r.lr},
          {"grad_norm", r.grad_norm}, {"virtual_end_ps", r.virtual_end}, {"wall_s", r.wall_s}};
}

}  // namespace

StepRecord step_of_entry(const nlohmann::json& e) {
  return {count_field<int>(e.at("step"), "a step record's step"),
          e.at("loss").get<double>(),
          e.at("ce").get<double>(),
          e.at("aux").get<double>(),
          e.at("lr").get<double>(),
          e.at("grad_norm").get<double>(),
          count_field<Time>(e.at("virtual_end_ps"), "a step record's virtual_end_ps"),
          e.at("wall_s").get<double>()};
}

nlohmann::json index_header(const DeviceProgram& p, int steps_done) {
  const TrainOptions& o = p.options;
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& s : p.table.specs()) tensors[s.name] = {{"shape", s.shape}};
  nlohmann::json steps = nlohmann::json::array();
  if (p.resume)
    for (const StepRecord& r : p.resume->history) steps.push_back(step_entry(r));
  for (const StepRecord& r : p.result.steps) steps.push_back(step_entry(r));
  return {{"format", kCheckpointFormat},
          {"version", kCheckpointVersion},
          {"step", steps_done},
          {"world", o.parallel.world()},
          {"config", o.to_json()},
          // The global batch of step s is a pure function of (data, batch,
          // seq, sampling, seed, s): the next step is the whole position.
          {"data", {{"data", o.data}, {"sampling", model::sampling_name(o.sampling)}, {"seed", o.seed},
                    {"batch", o.model.batch_size}, {"seq", o.model.block_size}, {"next_step", steps_done}}},
          // Initialization and sampling draw from counter-based streams keyed
          // by (seed, name, index) and (seed, step, row): no generator state.
          {"rng", {{"kind", "counter-based"}, {"seed", o.seed}}},
          {"tensors", tensors},
          {"steps", steps}};
}

}  // namespace shardlab::train
