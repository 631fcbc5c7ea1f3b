// The parameter table: nanoGPT names, shapes, init and layout in one flat
// buffer (llm.c style). Tensors follow nanoGPT's state_dict order: wte, wpe,
// then each block (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp...), then ln_f.
// The LM head is tied to wte and not stored. Linear weights are (out, in).
//
// Init (nanoGPT): Linear and Embedding weights N(0, 0.02); every c_proj
// weight (attention, MLP, experts) N(0, 0.02/sqrt(2·n_layer)); biases 0;
// LayerNorm weight 1, bias 0. Normal draws come from the counter-based RNG
// keyed by (seed, name, element index), so init_slice gives exactly the same
// values as the corresponding part of init_all.
//
// Size letters: C n_embd, T block_size, V vocab, E experts.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "runtime/tensor.h"

namespace shardlab::model {

enum class InitKind { kNormal, kZeros, kOnes };

struct ParamSpec {
  std::string name;    // e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;         // e.g. [3C, C]
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
  InitKind init = InitKind::kZeros;
  double std = 0;  // for kNormal
  int layer = -1;  // block index, -1 outside the blocks
  // nanoGPT's optimizer groups: weight decay only on tensors of 2+ dims.
  bool decay() const { return shape.size() >= 2; }
};

class ParamTable {
 public:
  explicit ParamTable(const GPTConfig& config);  // validates config

  const GPTConfig& config() const { return config_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t numel() const { return numel_; }
  // nullptr if there is no such tensor.
  const ParamSpec* find(std::string_view name) const;
  // Throws ConfigError naming the tensor if there is no such tensor.
  const ParamSpec& at(std::string_view name) const;

  // Elements [offset, offset + count) of tensor `name`, as init_all would
  // produce them. Throws ConfigError if the range is outside the tensor.
  template <typename Real>
  void init_slice(std::string_view name, uint64_t seed, int64_t offset, int64_t count,
                  Real* out) const;
  // Every tensor into the flat buffer params (numel()).
  template <typename Real>
  void init_all(uint64_t seed, Real* params) const;

 private:
  void add(std::string name, Shape shape, InitKind init, double std, int layer);
  void add_linear(const std::string& prefix, int64_t out, int64_t in, bool bias, double std,
                  int layer);
  void add_layernorm(const std::string& prefix, int64_t C, int layer);

  GPTConfig config_;
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  int64_t numel_ = 0;
};

// Tensor parallelism slices c_attn by heads: heads [h0, h1) own three
// contiguous row ranges of c_attn.weight (3C, C) and c_attn.bias (3C), one in
// each of q, k and v. Rows [begin, end); for the weight, elements
// [begin·C, end·C) (ready for init_slice).
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
};
std::array<RowRange, 3> c_attn_head_rows(int C, int n_head, int h0, int h1);

// Name helpers: block_name(2, "attn.c_attn.weight") = "transformer.h.2.attn.c_attn.weight";
// expert_name(2, 5, "c_fc.bias") = "transformer.h.2.mlp.experts.5.c_fc.bias".
std::string block_name(int layer, std::string_view suffix);
std::string expert_name(int layer, int expert, std::string_view suffix);

}  // namespace shardlab::model
