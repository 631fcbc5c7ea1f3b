// Sharded checkpoints and resume (--checkpoint-dir D --checkpoint-every N,
// --resume D), as PyTorch DCP and Megatron's dist-ckpt do them.
//
// Layout of D:
//   D/latest                   "step-000005\n": the last complete checkpoint
//   D/step-000005/index.json   the index (below)
//   D/step-000005/rank-00003.safetensors   what device 3 wrote: its
//                              parameter shards and its AdamW m and v
//
// Every device writes its own file from its own thread, only the elements it
// is the canonical holder of (dp rank 0 of a replica group, tp rank 0 of a
// replicated tensor, the first stage's wte; under ZeRO each dp rank its owned
// chunks of m and v), into D/.partial-step-000005/. Each then posts an
// untimed control message to device 0 (what it wrote, its clocks); device 0
// writes index.json, renames the directory into place and rewrites `latest`
// atomically. A crash at any point leaves the previous checkpoint and its
// `latest` intact. Writing a checkpoint takes no virtual time.
//
// The index (JSON): "format", "version", "step" (steps done), "config" (the
// run's TrainOptions::to_json), "data" (the sampler's position: it is a pure
// function of (seed, step), so the next step is the position), "rng" (the
// counter-based streams' seed), "tensors" (global shape of every tensor),
// "shards" (per stored piece: tensor, state "param" | "exp_avg" |
// "exp_avg_sq", file, key, split_dim, ranges along it in global indices,
// local_shape, flat_range [a, b) of the local row-major tensor, as Megatron's
// flattened_range), "devices" (per device: mesh name, stream clocks, port free
// times, busy totals, peaks) and "steps" (the records so far).
//
// Resume reads every shard into unsharded tensors (global offsets) and each
// new device takes its slice, so any parallel config can resume any
// checkpoint of the same model (resharding). Under the same parallel config
// every device's clocks are restored exactly (bit-identical continuation);
// under another one every device starts at the old run's latest clock.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/params.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"

namespace shardlab::train {

class DeviceSetup;
struct DeviceProgram;

// One device's virtual clocks at a checkpoint.
struct DeviceClock {
  Time compute = 0, comm = 0;
  Time egress[kNumLinkClasses] = {0, 0}, ingress[kNumLinkClasses] = {0, 0};
};

// What a resumed run starts from, read on the main thread before any device
// thread starts.
struct ResumeState {
  std::string path;  // D/step-000005
  int step = 0;      // steps done
  // Unsharded, laid out by the ParamTable.
  std::vector<float> params, exp_avg, exp_avg_sq;
  bool same_layout = false;        // the same parallel config: clocks per device
  std::vector<DeviceClock> clocks;  // (old devices)
  std::vector<DeviceStats> stats;   // (old devices) busy totals and peaks so far
  Time restart = 0;                 // the old run's latest clock
  std::vector<StepRecord> history;  // the steps done
  std::string describe() const;     // "step 5 of D/step-000005 (same layout)"
};

// The checkpoint directory's name for `step` ("step-000005").
std::string checkpoint_name(int step);

// Reads the latest checkpoint of options.resume_dir for this run. Throws
// ConfigError ("`resume_dir` D: ...", one line) for an empty or missing
// directory, a missing or corrupt index, a missing or truncated shard file,
// a tensor not covered, another model, or more steps done than `steps`.
ResumeState load_checkpoint(const TrainOptions& options, const model::ParamTable& table);

// Before the run: the checkpoint directory exists (created if missing) and
// is writable; leftovers of an interrupted write are removed.
void prepare_checkpoint_dir(const std::string& dir);

// Whether a checkpoint is written after `steps_done` steps.
bool checkpoint_due(const TrainOptions& options, int steps_done);

// On every device thread: writes its file; device 0 then completes the
// checkpoint (index, rename, latest).
void save_device_checkpoint(const DeviceProgram& program, DeviceSetup& setup, Device& dev, int steps_done);

// On every device thread after setup: its parameter and AdamW shards from
// the unsharded state, and its clocks.
void restore_device(const DeviceProgram& program, DeviceSetup& setup, Device& dev);

// After the run: the checkpoint's step records before the new ones (host
// seconds counted on from the earlier runs' loops), and
// (same layout) the devices' busy totals and peaks before the resume added
// to the run's, so the report reads as one uninterrupted run.
void merge_resumed(const ResumeState& state, TrainResult& result);

}  // namespace shardlab::train
