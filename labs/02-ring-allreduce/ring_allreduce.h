// Lab 2: the function you write (ring_allreduce.cc in this folder).
#pragma once

#include <span>

#include "collectives/group.h"
#include "runtime/device.h"

namespace shardlab::labs {

// Sums `data` element by element over the members of `g`, in place: on
// return every member holds the same sums. The ring algorithm: a
// reduce-scatter (n-1 steps) then an all-gather (n-1 steps); each step sends
// one chunk (collectives::chunk_range(data.size(), n, c)) to the right
// neighbour and receives one from the left, with Device::isend and
// Device::recv on dev.comm(). Tags: any values below 2^63.
void ring_all_reduce(Device& dev, const collectives::ProcessGroup& g, std::span<float> data);

}  // namespace shardlab::labs
