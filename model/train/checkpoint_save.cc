// Writing a sharded checkpoint (checkpoint.h): every device its own file,
// device 0 the index and the commit. Under mpirun the leader's process
// writes every file: a device of another process sends its file's bytes
// with its part of the index, so the whole checkpoint lands on the leader's
// host whether or not the hosts share a file system (a resume reads it
// there, checkpoint_load.cc).
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "model/train/checkpoint.h"
#include "model/train/checkpoint_json.h"
#include "model/train/device_program.h"
#include "model/train/device_setup.h"
#include "model/engine/shard_io.h"
#include "runtime/errors.h"
#include "runtime/output_file.h"
#include "runtime/parse_number.h"
#include "runtime/transport.h"

namespace shardlab::train {

namespace fs = std::filesystem;
using parallel::ShardSpec;

namespace {

// Control messages of a checkpoint: "CPKT" plus the step (below the
// collectives' tag space, bit 63, and apart from the pipeline's tags).
constexpr Tag kCheckpointTag = 0x4350'4b54'0000'0000ull;

constexpr const char* kFlag = "`checkpoint_dir`";

// One stored piece: local elements [begin, end) of shard `spec` of one state.
struct Piece {
  const ShardSpec* spec;
  const char* state;
  int64_t begin, end;
  const float* data;  // end - begin floats
  std::string key() const { return fmt::format("{}/{}/{}", state, spec->name, begin); }
};

// The pieces this device is the canonical holder of: its parameter shards
// and, for the elements it owns, AdamW's m and v. Without ZeRO, dp rank 0
// (edp rank 0 for experts) writes for every replica; with ZeRO every dp rank
// owns distinct chunks. Under ZeRO-3 a rank holds only its owned chunks of
// the parameters between steps (the rest is dropped, NaN: fsdp.cc free), so
// it writes those, as it writes its moments (until session 34 dp rank 0
// wrote its whole shards, NaNs included, and every resumed step was NaN).
std::vector<Piece> pieces_of(DeviceSetup& s) {
  std::vector<Piece> out;
  const auto params = s.model->params();
  auto replica_writes = [&](const ShardSpec& spec) { return spec.expert ? s.coords.edp == 0 : s.coords.dp == 0; };
  if (s.fsdp) {
    engine::for_owned(s.model->shards(), s.dp->owned(), [&](const ShardSpec& spec, int64_t begin, int64_t end, int64_t) {
      if (engine::canonical_copy(spec, s.coords))
        out.push_back({&spec, kStateParam, begin, end, params.data() + spec.offset + begin});
    });
  } else {
    for (const ShardSpec& spec : s.model->shards())
      if (engine::canonical_copy(spec, s.coords) && replica_writes(spec))
        out.push_back({&spec, kStateParam, 0, spec.numel, params.data() + spec.offset});
  }
  const float* m = s.optimizer->exp_avg().data();
  const float* v = s.optimizer->exp_avg_sq().data();
  engine::for_owned(s.model->shards(), s.dp->owned(), [&](const ShardSpec& spec, int64_t begin, int64_t end, int64_t at) {
    if (!engine::canonical_copy(spec, s.coords) || (s.dp->zero() == 0 && !replica_writes(spec))) return;
    out.push_back({&spec, kStateExpAvg, begin, end, m + at});
    out.push_back({&spec, kStateExpAvgSq, begin, end, v + at});
  });
  return out;
}

// This device's file (into `bytes`) and its part of the index.
nlohmann::json device_file(DeviceSetup& s, Device& dev, std::string& bytes) {
  const std::string file = fmt::format("rank-{:05d}.safetensors", dev.rank());
  const std::vector<Piece> pieces = pieces_of(s);
  std::vector<model::NamedTensorView> views;
  nlohmann::json shards = nlohmann::json::array();
  for (const Piece& p : pieces) {
    const bool whole = p.begin == 0 && p.end == p.spec->numel;
    views.push_back({p.key(), whole ? p.spec->local_shape : Shape{p.end - p.begin}, p.data});
    shards.push_back(shard_entry(*p.spec, p.state, file, p.key(), p.begin, p.end));
  }
  bytes = model::safetensors_bytes(views);
  return {{"rank", dev.rank()}, {"file", file}, {"device", device_entry(s, dev)}, {"shards", shards}};
}

// Device 0: the index from every device's part, then the directory renamed
// into place and `latest` pointed at it.
void commit(const DeviceProgram& p, Device& dev, const fs::path& tmp, int steps_done,
            std::vector<nlohmann::json> parts) {
  nlohmann::json index = index_header(p, steps_done);
  nlohmann::json& devices = index["devices"] = nlohmann::json::array();
  nlohmann::json& shards = index["shards"] = nlohmann::json::array();
  for (nlohmann::json& part : parts) {
    nlohmann::json d = std::move(part["device"]);
    d["rank"] = part["rank"];
    d["file"] = part["file"];
    devices.push_back(std::move(d));
    for (nlohmann::json& e : part["shards"]) shards.push_back(std::move(e));
  }
  write_file_atomic((tmp / "index.json").string(), index.dump(1) + "\n", kFlag);
  const fs::path dir = tmp.parent_path(), final = dir / checkpoint_name(steps_done);
  const fs::path old = dir / (kReplacedPrefix + checkpoint_name(steps_done));
  std::error_code ec;
  if (fs::exists(final, ec)) fs::rename(final, old, ec);  // a rerun into the same directory
  if (!ec) fs::rename(tmp, final, ec);
  if (ec) throw ConfigError(fmt::format("{} {}: cannot move the checkpoint into place: {}", kFlag, dir.string(), ec.message()));
  fs::remove_all(old, ec);
  write_file_atomic((dir / "latest").string(), checkpoint_name(steps_done) + "\n", kFlag);
  dev.log().info("checkpoint: {} written", final.string());
}

}  // namespace

bool checkpoint_due(const TrainOptions& o, int steps_done) {
  if (o.checkpoint_dir.empty()) return false;
  return steps_done == o.steps || (o.checkpoint_every > 0 && steps_done % o.checkpoint_every == 0);
}

void save_device_checkpoint(const DeviceProgram& p, DeviceSetup& s, Device& dev, int steps_done) {
  const fs::path tmp = fs::path(p.options.checkpoint_dir) / (kPartialPrefix + checkpoint_name(steps_done));
  const bool writer = leader_process();  // device 0's process: it writes the files
  std::error_code ec;
  if (writer) fs::create_directories(tmp, ec);  // every device may be first: an existing directory is fine
  if (writer && !fs::is_directory(tmp, ec))
    throw ConfigError(fmt::format("{} {}: cannot create {}", kFlag, p.options.checkpoint_dir, tmp.string()));
  std::string bytes;
  nlohmann::json part = device_file(s, dev, bytes);
  if (writer) write_file_atomic((tmp / part["file"].get<std::string>()).string(), bytes, kFlag);
  const Tag tag = kCheckpointTag + Tag(steps_done);
  if (dev.rank() != 0) {  // untimed: writing a checkpoint takes no virtual time
    // The part, then (from another process) the file: "<part's length>\n<part><file>".
    const std::string json = part.dump();
    const std::string msg = fmt::format("{}\n{}{}", json.size(), json, writer ? "" : bytes);
    dev.post_control(0, tag, std::as_bytes(std::span(msg.data(), msg.size())));
    return;
  }
  std::vector<nlohmann::json> parts{std::move(part)};
  for (int r = 1; r < dev.world_size(); ++r) {
    const Message m = dev.take_control(r, tag);
    const std::string_view msg(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
    const size_t eol = msg.find('\n');
    const std::optional<size_t> length = parse_number<size_t>(msg.substr(0, eol));  // written by this file
    SHARDLAB_CHECK(length && eol != std::string_view::npos, "a checkpoint part without its length line");
    const size_t n = *length;
    parts.push_back(nlohmann::json::parse(msg.substr(eol + 1, n)));
    if (eol + 1 + n < msg.size())  // a device of another process: its file
      write_file_atomic((tmp / parts.back()["file"].get<std::string>()).string(), msg.substr(eol + 1 + n), kFlag);
  }
  commit(p, dev, tmp, steps_done, std::move(parts));
}

}  // namespace shardlab::train
