// nccl-tests on the virtual cluster: one collective over N virtual GPUs, one
// size at a time, timed in virtual time and in host wall time, optionally
// checked against a serial reference. `shardlab collectives` prints these
// rows as a table or bench_json; the Python bindings return the same.
//
//  bytes:  the full buffer, as nccl-tests counts it (all_reduce: the vector;
//          all_gather: the gathered output; reduce_scatter: the input;
//          all_to_all: one member's whole send buffer). For reduce_scatter,
//          all_gather and all_to_all the count is rounded down to a multiple
//          of the ranks, as nccl-tests does.
//  time:   virtual time of one collective, all ranks starting at 0 (each size
//          runs on a fresh cluster): the latest rank's comm-stream end.
//  algbw = bytes / time; busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n
//          (reduce_scatter, all_gather, all_to_all), 1 (broadcast, reduce).
//  host:   wall time per collective over a few more iterations after a
//          warm-up, all ranks released together; host_busbw likewise.
//          When ranks x buffer would exceed 4 GiB of host memory the row
//          runs on phantom buffers: same virtual time, no host figures.
//  max_error: with `check`, the largest |result - serial reference| over
//          every rank (inputs are multiples of 1/8, so any order is exact);
//          infinite ("inf" in JSON) when a result is NaN or infinite.
//
// Thread safety: each call runs its own Cluster; calls do not share state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "collectives/collectives.h"
#include "runtime/profile.h"
#include "runtime/time.h"
#include "runtime/trace.h"

namespace shardlab::collectives {

struct BenchOptions {
  OpKind op = OpKind::kAllReduce;
  Algo algo = Algo::kAuto;
  Proto proto = Proto::kAuto;    // kAuto: the tuner's, with the algorithm
  ReduceOp redop = ReduceOp::kSum;
  int ranks = 8;
  bool check = false;             // max_error against the serial reference
  std::optional<float> corrupt;   // testing `check`: rank 0's first result is set to this
  bool trace = false;             // keep the devices' traces (no host timing then)
  double pace = 0;                // ClusterOptions::pace
};

struct BenchRow {
  uint64_t bytes = 0;
  size_t count = 0;
  Algo algo = Algo::kAuto;       // the one that ran (kAuto: the tuner's choice)
  int channels = 1;              // rings the ring algorithm runs (tuner.h RingPlan)
  Proto proto = Proto::kAuto;    // the protocol that ran (the tuner's choice)
  Time time = 0;
  std::optional<double> host_s;  // per collective; empty on phantom rows
  std::optional<double> max_error;
};

// Whether the operation reduces (takes a ReduceOp).
bool reduces(OpKind op);

// One size on a fresh cluster of `options.ranks` devices of `profile`: the
// first collective timed in virtual time (and checked), the next few in host
// wall time. With `options.trace`, the run's traces are appended to `traces`
// after the previous sizes' (`trace_offset` moves on).
BenchRow bench_collective(const HardwareProfile& profile, const BenchOptions& options, uint64_t bytes,
                          std::vector<DeviceTrace>& traces, Time& trace_offset);

struct Bandwidth {
  double algbw, busbw;  // GB/s, virtual
  std::optional<double> host_busbw;
};
Bandwidth bandwidth(const BenchRow& row, const BenchOptions& options);

// {"op", "ranks", "algo", "profile", "redop", "rows": [{bytes, count, algo,
// channels, protocol, time_us, algbw_GBps, busbw_GBps, host_time_us, host_busbw_GBps,
// max_error}]} (null where a row has no figure; max_error "inf" when infinite).
nlohmann::json bench_json(const std::vector<BenchRow>& rows, const BenchOptions& options, const std::string& profile);

}  // namespace shardlab::collectives
