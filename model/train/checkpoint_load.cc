// Reading a sharded checkpoint (checkpoint.h) into unsharded tensors, and
// each device of the resumed run taking its slice of them.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "model/train/checkpoint.h"
#include "model/train/checkpoint_json.h"
#include "model/train/device_program.h"
#include "model/train/device_setup.h"
#include "model/engine/model_json.h"
#include "model/engine/shard_io.h"
#include "runtime/errors.h"
#include "runtime/output_file.h"
#include "runtime/transport.h"

namespace shardlab::train {

namespace fs = std::filesystem;
using parallel::ShardSpec;

std::string checkpoint_name(int step) { return fmt::format("step-{:06d}", step); }

std::string ResumeState::describe() const {
  return fmt::format("step {} of {} ({})", step, path,
                     same_layout ? "same parallel layout: clocks restored per device"
                                 : "resharded: every device starts at the old run's latest clock");
}

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The checkpoint `latest` names, checked to be one of ours (no other path).
fs::path latest_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError("no such directory");
  if (!fs::is_regular_file(dir / "latest", ec))
    throw ConfigError("no checkpoint in it (no \"latest\" file; write one with `checkpoint_dir`)");
  std::string name = read_text(dir / "latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  const bool ours = name.size() == 11 && name.rfind("step-", 0) == 0 &&
                    name.find_first_not_of("0123456789", 5) == std::string::npos;
  if (!ours) throw ConfigError(fmt::format("\"latest\" names \"{}\", not a checkpoint (step-NNNNNN)", name));
  fs::path chosen = dir / name;
  if (!fs::exists(chosen, ec) && fs::is_directory(dir / (kReplacedPrefix + name), ec))
    chosen = dir / (kReplacedPrefix + name);  // a rerun died between its two renames
  if (!fs::is_regular_file(chosen / "index.json", ec)) throw ConfigError(fmt::format("{} has no index.json", name));
  return chosen;
}

// The unsharded state a piece belongs in, and which of its elements are set.
struct Assembly {
  std::vector<float>* state;
  std::vector<char> covered;
};

// Copies every stored piece into its unsharded tensor, through its shard's
// global offsets; the shard files are read once each.
void assemble(const nlohmann::json& index, const fs::path& dir, const model::ParamTable& table,
              std::map<std::string, Assembly>& states) {
  std::map<std::string, model::SafetensorsFile> files;
  for (const nlohmann::json& e : index.at("shards")) {
    const std::string name = e.at("tensor").get<std::string>();
    const model::ParamSpec* spec = table.find(name);
    if (!spec) throw ConfigError(fmt::format("unexpected tensor \"{}\" (not in this model)", name));
    const auto st = states.find(e.at("state").get<std::string>());
    if (st == states.end()) throw ConfigError(fmt::format("unknown state \"{}\"", e.at("state").dump()));
    const ShardSpec shard = shard_of_entry(e, spec->shape);
    const int64_t begin = count_field<int64_t>(e.at("flat_range").at(0), "flat_range"),
                  end = count_field<int64_t>(e.at("flat_range").at(1), "flat_range");
    if (begin < 0 || begin >= end || end > shard.numel)
      throw ConfigError(fmt::format("shard of \"{}\": flat_range outside the shard", name));
    const std::string file = e.at("file").get<std::string>();
    if (file.find('/') != std::string::npos || file.empty() || file[0] == '.')
      throw ConfigError(fmt::format("shard file \"{}\" is not in the checkpoint's directory", file));
    if (!files.count(file)) files.emplace(file, model::load_safetensors((dir / file).string()));
    const model::LoadedTensor& t = files.at(file).at(e.at("key").get<std::string>());
    if (int64_t(t.data.size()) != end - begin)
      throw ConfigError(fmt::format("{}: \"{}\" holds {} values, the index says {}", file, e.at("key").get<std::string>(),
                                    t.data.size(), end - begin));
    for (int64_t i = begin; i < end; ++i) {
      const auto at = size_t(spec->offset + parallel::global_index(shard, i));
      (*st->second.state)[at] = t.data[size_t(i - begin)];
      st->second.covered[at] = 1;
    }
  }
  for (const auto& [state, a] : states)
    for (const auto& s : table.specs())
      for (int64_t i = 0; i < s.numel; ++i)
        if (!a.covered[size_t(s.offset + i)])
          throw ConfigError(fmt::format("no shard holds {} of \"{}\" element {} (a shard file or index entry is missing)",
                                        state, s.name, i));
}

// Everything but the tensors: step, model, clocks, history.
void read_header(const nlohmann::json& index, const TrainOptions& o, const model::ParamTable& table, ResumeState& r) {
  if (index.at("format") != kCheckpointFormat || index.at("version") != kCheckpointVersion)
    throw ConfigError(fmt::format("index.json is not a {} version {} index", kCheckpointFormat, kCheckpointVersion));
  r.step = integer_field<int>(index.at("step"), "index.json: step", 1, std::numeric_limits<int>::max());
  if (r.step > o.steps)
    throw ConfigError(fmt::format("the checkpoint is at step {} but `steps` is {} (the total step count)", r.step, o.steps));
  const nlohmann::json& config = index.at("config");
  engine::check_model_json(config.at("model"), o.model, fs::path(r.path).filename().string());
  for (const auto& s : table.specs())
    if (!index.at("tensors").contains(s.name) || index["tensors"][s.name].at("shape").get<Shape>() != s.shape)
      throw ConfigError(fmt::format("tensor \"{}\" is missing or has another shape", s.name));
  for (const auto& [name, t] : index.at("tensors").items())
    if (!table.find(name)) throw ConfigError(fmt::format("unexpected tensor \"{}\" (not in this model)", name));
  const nlohmann::json run = o.to_json();
  const auto& devices = index.at("devices");
  // One entry per device of the run that wrote it: the clocks a resume starts
  // from (an index without them would restart the clock at 0).
  const int world = integer_field<int>(index.at("world"), "index.json: world", 1, std::numeric_limits<int>::max());
  if (!devices.is_array() || devices.size() != size_t(world))
    throw ConfigError(fmt::format("index.json: {} device entries for a world of {}",
                                  devices.is_array() ? devices.size() : 0, world));
  r.same_layout = config.at("parallel") == run["parallel"] && config.at("micro_batches") == run["micro_batches"] &&
                  world == o.parallel.world();
  for (size_t d = 0; d < devices.size(); ++d) {
    r.clocks.push_back(clock_of_entry(devices[d]));
    r.stats.push_back(stats_of_entry(devices[d], int(d)));
    const DeviceClock& c = r.clocks.back();
    r.restart = std::max({r.restart, c.compute, c.comm, c.egress[0], c.egress[1], c.ingress[0], c.ingress[1]});
  }
  for (const nlohmann::json& e : index.at("steps")) r.history.push_back(step_of_entry(e));
  if (int(r.history.size()) != r.step)
    throw ConfigError(fmt::format("index.json has {} step records for step {}", r.history.size(), r.step));
  for (size_t i = 0; i < r.history.size(); ++i)
    if (r.history[i].step != int(i))
      throw ConfigError(fmt::format("index.json: step record {} says step {}", i, r.history[i].step));
}

// Runs one part of reading a checkpoint, its errors as one `resume_dir` line.
template <class F>
auto resume_part(const TrainOptions& o, F&& part) {
  try {
    return part();
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("`resume_dir` {}: {}", o.resume_dir, e.what()));
  } catch (const nlohmann::json::exception& e) {  // a field missing or of another type
    throw ConfigError(fmt::format("`resume_dir` {}: index.json: {}", o.resume_dir, e.what()));
  }
}

// The checkpoint at `path` from its index's text: everything but the
// tensors, which are zero-filled (`index` is left parsed).
ResumeState from_index(const TrainOptions& o, const model::ParamTable& table, const std::string& path,
                       const std::string& text, nlohmann::json& index) {
  ResumeState r;
  r.path = path;
  index = nlohmann::json::parse(text, nullptr, false);
  if (index.is_discarded() || !index.is_object()) throw ConfigError("index.json is not valid JSON");
  read_header(index, o, table, r);
  const auto n = size_t(table.numel());
  r.params.assign(n, 0.0f), r.exp_avg.assign(n, 0.0f), r.exp_avg_sq.assign(n, 0.0f);
  return r;
}

// The latest checkpoint from this process's disk, and its index's text.
std::pair<ResumeState, std::string> read_checkpoint(const TrainOptions& o, const model::ParamTable& table) {
  const fs::path path = latest_checkpoint(o.resume_dir);
  std::string text = read_text(path / "index.json");
  nlohmann::json index;
  ResumeState r = from_index(o, table, path.string(), text, index);
  std::map<std::string, Assembly> states{{kStateParam, {&r.params, std::vector<char>(r.params.size(), 0)}},
                                         {kStateExpAvg, {&r.exp_avg, std::vector<char>(r.params.size(), 0)}},
                                         {kStateExpAvgSq, {&r.exp_avg_sq, std::vector<char>(r.params.size(), 0)}}};
  assemble(index, path, table, states);
  return {std::move(r), std::move(text)};
}

}  // namespace

ResumeState load_checkpoint(const TrainOptions& o, const model::ParamTable& table) {
  Transport* t = process_transport();
  if (!t) return resume_part(o, [&] { return read_checkpoint(o, table).first; });
  // Under mpirun the checkpoint is on the leader's host (checkpoint_save.cc
  // gathers it there; other hosts may hold nothing): the leader reads it,
  // the others parse its index and take its tensors bit for bit.
  std::string mine;
  ResumeState r;
  if (t->process() == 0) {
    try {
      auto [state, text] = resume_part(o, [&] { return read_checkpoint(o, table); });
      r = std::move(state);
      mine = "+" + r.path + "\n" + text;
    } catch (const ConfigError& e) {
      mine = std::string("-") + e.what();
    }
  }
  const std::string leader = t->exchange(mine)[0];
  if (leader.empty() || leader[0] == '-') throw ConfigError(leader.empty() ? "`resume_dir`: no answer" : leader.substr(1));
  if (t->process() != 0) {
    const size_t eol = leader.find('\n');
    nlohmann::json index;
    r = resume_part(o, [&] { return from_index(o, table, leader.substr(1, eol - 1), leader.substr(eol + 1), index); });
  }
  merge_disjoint(r.params), merge_disjoint(r.exp_avg), merge_disjoint(r.exp_avg_sq);
  return r;
}

void prepare_checkpoint_dir(const std::string& dir) {
  if (!leader_process()) return;  // under mpirun the leader's host holds the checkpoints
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    throw ConfigError(fmt::format("`checkpoint_dir` {}: not a directory and cannot be created{}", dir,
                                  ec ? " (" + ec.message() + ")" : ""));
  check_writable((fs::path(dir) / "latest").string(), "`checkpoint_dir`");
  // An interrupted write's leftovers: a partial checkpoint is removed; a
  // replaced one (a rerun into the same directory) whose successor never
  // arrived is put back, so `latest` names a complete checkpoint again.
  std::vector<fs::path> entries;
  for (const auto& entry : fs::directory_iterator(dir, ec)) entries.push_back(entry.path());
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    if (name.rfind(kPartialPrefix, 0) == 0) fs::remove_all(p, ec);
    if (name.rfind(kReplacedPrefix, 0) != 0) continue;
    const fs::path original = p.parent_path() / name.substr(std::string(kReplacedPrefix).size());
    if (fs::exists(original, ec)) fs::remove_all(p, ec);
    else fs::rename(p, original, ec);
  }
}

void restore_device(const DeviceProgram& p, DeviceSetup& s, Device& dev) {
  const ResumeState& r = *p.resume;
  auto params = s.model->params();
  for (const ShardSpec& spec : s.model->shards())
    engine::slice_from_global(spec, std::span(r.params).subspan(size_t(p.table.at(spec.name).offset)), 0, spec.numel,
                      params.data() + spec.offset);
  float* m = s.optimizer->exp_avg().data();
  float* v = s.optimizer->exp_avg_sq().data();
  engine::for_owned(s.model->shards(), s.dp->owned(), [&](const ShardSpec& spec, int64_t begin, int64_t end, int64_t at) {
    const auto base = size_t(p.table.at(spec.name).offset);
    engine::slice_from_global(spec, std::span(r.exp_avg).subspan(base), begin, end, m + at);
    engine::slice_from_global(spec, std::span(r.exp_avg_sq).subspan(base), begin, end, v + at);
  });
  DeviceClock c;
  if (r.same_layout) {
    c = r.clocks[size_t(dev.rank())];
  } else {
    c = {r.restart, r.restart, {r.restart, r.restart}, {r.restart, r.restart}};
  }
  dev.compute().wait({c.compute});
  dev.comm().wait({c.comm});
  dev.set_all_ports(c.egress, c.ingress);
}

void merge_resumed(const ResumeState& r, TrainResult& result) {
  // Host seconds go on from the earlier runs' loops, as the virtual clock does.
  const double wall_before = r.history.empty() ? 0.0 : r.history.back().wall_s;
  for (StepRecord& s : result.steps) s.wall_s += wall_before;
  result.loop_wall_s += wall_before;
  result.steps.insert(result.steps.begin(), r.history.begin(), r.history.end());
  if (!r.same_layout) return;
  for (DeviceStats& d : result.run.devices) {
    const DeviceStats& before = r.stats[size_t(d.rank)];
    d.compute_busy += before.compute_busy;
    d.comm_busy += before.comm_busy;
    d.comm_exposed += before.comm_exposed;
    d.compute_transfer += before.compute_transfer;
    d.compute_flops += before.compute_flops;
    d.peak_bytes = std::max(d.peak_bytes, before.peak_bytes);
    for (int k = 0; k < kNumMemKinds; ++k) d.peak_by_kind[k] = std::max(d.peak_by_kind[k], before.peak_by_kind[k]);
  }
}

}  // namespace shardlab::train
