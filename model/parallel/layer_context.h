// LayerContext: what every sharded layer needs besides its weights and its
// groups — the device it runs on and where its kernels charge their cost.
// Each parallelism's context extends it with its own groups: TpContext
// (tensor/mappings.h), ExpertContext (expert/moe.h); the attention cores
// (attention_core.h) take it as it is.
//
// Thread safety: a value used on the device's own thread.
#pragma once

#include "collectives/collectives.h"
#include "model/sink.h"

namespace shardlab::parallel {

struct LayerContext {
  Device* dev = nullptr;
  model::Exec ex;  // where kernels charge their cost

  // Communication inside a layer sits on the critical path: it runs on the
  // compute stream, as Megatron's does (NCCL kernels on the current stream),
  // so it never queues behind data-parallel buckets on the communication stream.
  collectives::CollOptions on_compute() const {
    collectives::CollOptions o;
    o.stream = &dev->compute();
    return o;
  }
};

}  // namespace shardlab::parallel
