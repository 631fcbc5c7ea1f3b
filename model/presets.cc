// The built-in model shapes: nanoGPT-sized toys and two published families.
//
// GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners",
// Table 2.1): n_layers, d_model, n_heads (d_head = d_model / n_heads), context
// 2048, GPT-2's BPE vocabulary of 50257 tokens, padded the Megatron way by
// default (50304 at tp 1, 51200 at tp 8: the 51200 of Megatron's GPT-3 runs).
// Batch sizes are published in tokens: 0.5M = 256 x 2048 = 524,288, 1M = 512
// sequences, 2M = 1024, 3.2M = 1536 (3,145,728 tokens). Two rows of the
// table do not multiply out: 13B prints d_model 5140, which 40 heads of 128
// do not give (40 x 128 = 5120 is used), and 1.3B prints 24 heads of 128 for
// d_model 2048 (16 x 128 = 2048 is used; heads do not change the parameter
// count, which rounds to the published figure either way). The sparse
// (locally banded) attention layers of GPT-3 are not modeled: they change no
// parameter.
//
// Megatron-LM (Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM", Table 1): heads, hidden size,
// layers and batch size (sequences) of its ten weak-scaling runs on Selene,
// vocab 51200 (already a multiple of 128 x tp for the tp up to 8 it uses),
// seq 2048.
#include <string>

#include "model/config.h"
#include "runtime/errors.h"

namespace shardlab::model {
namespace {

GPTConfig shape(int layers, int heads, int embd, int seq, int vocab, int batch) {
  GPTConfig c;
  c.n_layer = layers, c.n_head = heads, c.n_embd = embd, c.block_size = seq, c.vocab_size = vocab;
  c.batch_size = batch;
  return c;
}

PresetInfo toy(std::string name, GPTConfig c) {
  return {std::move(name), c, 0, 0, false, "shardlab (nanoGPT-sized)"};
}

PresetInfo gpt3(std::string name, int layers, int embd, int heads, int batch, double params,
                double resolution) {
  return {std::move(name),
          shape(layers, heads, embd, 2048, 50257, batch),
          params,
          resolution,
          true,
          "Brown et al. 2020, Table 2.1"};
}

// Table 1 prints parameters in billions with one decimal.
PresetInfo megatron(std::string name, double billions, int heads, int hidden, int layers,
                    int batch) {
  return {std::move(name),
          shape(layers, heads, hidden, 2048, 51200, batch),
          billions * 1e9,
          0.1e9,
          true,
          "Narayanan et al. 2021, Table 1"};
}

std::vector<PresetInfo> make_presets() {
  return {
      toy("nano", shape(2, 2, 64, 32, 256, 4)),
      toy("tiny", GPTConfig{}),  // the defaults are tiny
      toy("small", shape(6, 6, 384, 256, 4096, 16)),
      gpt3("gpt3-125m", 12, 768, 12, 256, 125e6, 1e6),
      gpt3("gpt3-350m", 24, 1024, 16, 256, 350e6, 10e6),
      gpt3("gpt3-760m", 24, 1536, 16, 256, 760e6, 10e6),
      gpt3("gpt3-1.3b", 24, 2048, 16, 512, 1.3e9, 0.1e9),  // the table: 24 heads (of 128)
      gpt3("gpt3-2.7b", 32, 2560, 32, 512, 2.7e9, 0.1e9),
      gpt3("gpt3-6.7b", 32, 4096, 32, 1024, 6.7e9, 0.1e9),
      gpt3("gpt3-13b", 40, 5120, 40, 1024, 13e9, 1e9),
      gpt3("gpt3-175b", 96, 12288, 96, 1536, 175e9, 1e9),
      megatron("megatron-1.7b", 1.7, 24, 2304, 24, 512),
      megatron("megatron-3.6b", 3.6, 32, 3072, 30, 512),
      megatron("megatron-7.5b", 7.5, 32, 4096, 36, 512),
      megatron("megatron-18.4b", 18.4, 48, 6144, 40, 1024),
      megatron("megatron-39.1b", 39.1, 64, 8192, 48, 1536),
      megatron("megatron-76.1b", 76.1, 80, 10240, 60, 1792),
      megatron("megatron-145.6b", 145.6, 96, 12288, 80, 2304),
      megatron("megatron-310.1b", 310.1, 128, 16384, 96, 2160),
      megatron("megatron-529.6b", 529.6, 128, 20480, 105, 2520),
      megatron("megatron-1t", 1008.0, 160, 25600, 128, 3072),
  };
}

}  // namespace

const std::vector<PresetInfo>& presets() {
  static const std::vector<PresetInfo> all = make_presets();
  return all;
}

const PresetInfo& preset_info(std::string_view name) {
  for (const PresetInfo& p : presets())
    if (p.name == name) return p;
  std::string known;
  for (const PresetInfo& p : presets()) known += (known.empty() ? "" : ", ") + p.name;
  throw ConfigError("--model: unknown preset '" + std::string(name) + "' (choose " + known + ")");
}

GPTConfig preset(std::string_view name) { return preset_info(name).config; }

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const PresetInfo& p : presets()) names.push_back(p.name);
  return names;
}

}  // namespace shardlab::model
