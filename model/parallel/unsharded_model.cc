#include "model/parallel/local_model.h"
#include "model/parallel/unsharded_model.h"
#include "runtime/errors.h"
#include "model/parallel/pipeline/stage.h"

namespace shardlab::parallel {

int64_t global_index(const ShardSpec& s, int64_t i) {
  if (s.split_dim < 0) return i;
  // Row-major: position along split_dim and the rest.
  const int64_t local_rows = s.local_shape[0];
  const int64_t local_cols = s.local_shape.size() > 1 ? s.local_shape[1] : 1;
  const int64_t global_cols = s.global_shape.size() > 1 ? s.global_shape[1] : 1;
  int64_t r = i / local_cols, c = i % local_cols;
  SHARDLAB_CHECK(r < local_rows);
  int64_t& along = s.split_dim == 0 ? r : c;
  for (const auto& range : s.ranges) {
    if (along < range.size) {
      along += range.begin;
      return r * global_cols + c;
    }
    along -= range.size;
  }
  SHARDLAB_CHECK(false, "local index outside the shard's ranges");
  return -1;
}

std::vector<ShardSpec> whole_tensor_shards(const model::ParamTable& table) {
  std::vector<ShardSpec> out;
  for (const auto& p : table.specs()) {
    ShardSpec s;
    s.name = p.name;
    s.global_shape = p.shape;
    s.local_shape = p.shape;
    s.offset = p.offset;
    s.numel = p.numel;
    s.decay = p.decay();
    s.layer = p.layer;
    s.expert = p.is_expert();
    s.role = p.role;
    out.push_back(std::move(s));
  }
  return out;
}

UnshardedModel::UnshardedModel(const model::GPTConfig& config, uint64_t seed)
    : OneStageModel(StagePlacement{}.resolved(config)),
      gpt_(config, seed),
      shards_(whole_tensor_shards(gpt_.table())) {
  if (config.is_moe()) moe_step_.resize(size_t(config.n_layer));
}

float UnshardedModel::forward(const model::Token* inputs, const model::Token* targets, int B, int T) {
  const float loss = gpt_.forward(inputs, targets, B, T);
  count_moe(static_cast<int64_t>(B) * T);
  return loss;
}

void UnshardedModel::set_sink(model::OpSink* sink) {
  gate_.target = sink;
  gpt_.set_sink(sink ? &gate_ : nullptr);
}

void UnshardedModel::forward(int chunk, int mb, int, const MicroBatchTokens& tokens) {
  SHARDLAB_CHECK(chunk == 0 && in_flight_ < 0, "the unsharded model runs one micro-batch at a time");
  forward(tokens.inputs, tokens.targets, B_, T_);
  ce_sum_ += gpt_.ce_loss();
  aux_sum_ += gpt_.aux_loss();
  in_flight_ = mb;
}

void UnshardedModel::backward_input(int, int mb, int, float dloss, bool defer_weight, bool final) {
  SHARDLAB_CHECK(mb == in_flight_, "backward of a micro-batch the unsharded model does not hold");
  SHARDLAB_CHECK(!defer_weight, "the unsharded model has a fused backward only (no W action)");
  gate_.open = final;
  gpt_.backward(dloss);
  gate_.open = true;
  in_flight_ = -1;
}

void UnshardedModel::count_moe(int64_t N) {
  const model::GPTConfig& c = gpt_.config();
  for (int l = 0; l < c.n_layer; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const auto& a = gpt_.block_acts(l).moe;
    MoeStepStats& m = moe_step_[size_t(l)];
    if (m.layer != l) {
      m.layer = l;
      m.received.assign(size_t(c.n_expert), 0);
    }
    for (int e = 0; e < c.n_expert; ++e) m.received[size_t(e)] += a.offsets[e + 1] - a.offsets[e];
    m.dropped += N * c.top_k - a.M;
  }
}

}  // namespace shardlab::parallel
