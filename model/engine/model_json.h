// The model's shape as JSON, in the --report config and in a checkpoint's
// __metadata__["shardlab_config"], and the check of a checkpoint's shape
// against the run's before --init loads it.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/io/safetensors.h"

namespace shardlab::engine {

// {"layers", "heads", "embd", "seq", "vocab" (the table, padded or not),
// "vocab_unpadded" (the tokens), "make_vocab_size_divisible_by" (0: none),
// "ffn" (the MLP width), "experts", "top_k", "moe_every", "aux_coef",
// "capacity_factor"}; with experts also "moe_ffn" (a routed expert's width),
// "shared_experts", "router" ("softmax" or "sigmoid") and "moe_norm_topk".
nlohmann::json model_json(const model::GPTConfig& config);

// When `file` carries shardlab's config, its shape (layers, heads, embd,
// seq, vocab, ffn, experts, moe_every) must be the run's: ConfigError
// "`init_path` F: the checkpoint has `n_head` 8, this run 4" otherwise (the
// trainer checks the tensor shapes first; this catches what they cannot
// show, such as the heads). A file without it (or written before "ffn" was
// stored: 4 x embd) is checked by its tensor shapes alone.
// The same check on a stored model_json (`what` starts the message:
// "`resume_dir` D"); `field` names the option that holds the file.
void check_model_json(const nlohmann::json& saved, const model::GPTConfig& config, const std::string& what);

void check_checkpoint_model(const model::SafetensorsFile& file, const model::GPTConfig& config,
                            std::string_view field);

}  // namespace shardlab::engine
