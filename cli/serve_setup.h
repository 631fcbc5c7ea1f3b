// `shardlab serve`'s flags and what they set up before any device runs
// (cmd_serve.cc runs it): the replica's shape, the scheduler's options, the
// requests, the draft model, every refusal of a flag that means nothing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/train_flags.h"
#include "model/infer/sampler.h"
#include "model/io/safetensors.h"
#include "model/serve/cluster_step.h"
#include "model/serve/serving.h"
#include "model/serve/workload.h"

namespace shardlab::cli {

constexpr int kDefaultLen = 128;  // --prompt-len and --output-len unless given

struct ServeFlags {
  TrainFlags model;  // the shape flags, --tp --pp --ep, --memory, --precision, --phantom, --init, common flags
  serve::ServeOptions serving;  // --replicas and the scheduler's --max-seqs, --kv-block, ... bind here
  infer::SamplingOptions sampling;  // --temperature, --top-k, --top-p (the seed is --seed's)
  int requests = 100;
  int shared_prefix = 0;  // tokens every drawn prompt starts with
  std::string arrival = "poisson:1", prompt_len = std::to_string(kDefaultLen), output_len = prompt_len, workload;
  std::string batching = "continuous";
  std::string speculative, draft_init;  // --speculative draft=PRESET,k=N[,accept=P], --draft-init FILE
  std::string router = "round-robin", disaggregate;  // --router, --disaggregate prefill=N,decode=M
  double kv_fraction = 0.9;
  uint64_t seed = 1337;
  std::vector<std::string> drawn_given;  // which of --requests, --arrival, --prompt-len, --output-len were given
  bool replicas_given = false, router_given = false;
};

struct Setup {
  serve::ReplicaShape shape;
  serve::ServeOptions options;
  std::vector<serve::Request> requests;
  std::unique_ptr<model::SafetensorsFile> init;  // shape.init points here
  std::unique_ptr<model::SafetensorsFile> draft_init;  // shape.speculative->draft_init points here
  bool drawn_prompts = false;                    // some prompts drawn from --seed (a workload of lengths)
};

// Checks the flags (ConfigError, one line each) and builds the run.
Setup setup_of(ServeFlags& f);

}  // namespace shardlab::cli
