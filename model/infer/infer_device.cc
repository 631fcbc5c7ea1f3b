#include "model/infer/infer_device.h"

#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "runtime/errors.h"

namespace shardlab::infer {

namespace coll = collectives;

namespace {
// Point-to-point tag of the tokens from the last stage to the first (user range).
constexpr Tag kTokenTag = 0x494e'4654'0000'0000ull;  // "INFT"
}  // namespace

EngineGroups InferDevice::groups(parallel::ParallelContext& ctx, const InferPlan& plan) {
  const coll::ProcessGroup& pipeline = ctx.group("pp");
  return {&ctx.group("tp"), plan.ep > 1 ? &ctx.group("ep") : nullptr,
          {pipeline.members().begin(), pipeline.members().end()}, plan.placement(ctx.coords().pp), plan.kv_fp8};
}

InferDevice::InferDevice(Device& dev, const InferPlan& plan, const model::GPTConfig& config, uint64_t seed,
                         const model::SafetensorsFile* init)
    : dev_(dev), ctx_(plan.mesh, dev.rank()), engine_(config, seed, dev, groups(ctx_, plan), init),
      sampler_(plan.sampler) {
  const coll::DeviceMesh& mesh = plan.mesh;
  const coll::Coords c = ctx_.coords();
  const int last = mesh.shape().pp - 1;
  chooses_ = c.pp == last && c.ep == 0;
  if (c.pp == last && mesh.shape().ep > 1) {
    ep_ = &ctx_.group("ep");
    for (int i = 0; i < ep_->size(); ++i)
      if (mesh.coords(ep_->global_rank(i)).ep == 0) ep_root_ = i;
  }
  if (last > 0 && (c.pp == 0 || c.pp == last)) {
    coll::Coords peer = c;
    peer.pp = c.pp == 0 ? last : 0;
    stage_peer_ = mesh.rank(peer);
  }
}

std::vector<float> InferDevice::choose(const StepOutput& out, const std::vector<bool>& samples, Sampler& sampler,
                                       std::span<const DrawKey> keys) {
  const int64_t S = std::count(samples.begin(), samples.end(), true);
  SHARDLAB_CHECK(keys.empty() || int64_t(keys.size()) == S, "inference: one draw key per sampling sequence");
  std::vector<float> tokens(size_t(S), 0.0f);
  if (!chooses_ || S == 0) return tokens;
  const model::GPTConfig& m = engine_.config();
  charge_choice(S);
  if (out.logits.empty()) return tokens;  // phantom
  size_t k = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!samples[i]) continue;
    const std::span<const float> logits{out.logits.data() + i * size_t(m.vocab_size), size_t(m.token_vocab())};
    tokens[k] = float(keys.empty() ? sampler.next(logits) : sampler.draw(logits, keys[k].seed, keys[k].index));
    ++k;
  }
  return tokens;
}

void InferDevice::charge_choice(int64_t rows) {
  if (!chooses_ || rows == 0) return;
  const double V = engine_.config().vocab_size;
  dev_.run(dev_.compute(), "sample", OpCost{5.0 * V * double(rows), V * double(rows) * element_size(dev_.precision())});
}

void InferDevice::share(std::vector<float>& tokens, bool to_first_stage) {
  if (tokens.empty()) return;
  if (ep_) coll::broadcast(dev_, *ep_, coll::Buffer(tokens.data(), tokens.size()), ep_root_, {.stream = &dev_.compute()});
  if (stage_peer_ < 0 || !to_first_stage) return;
  const size_t bytes = tokens.size() * sizeof(float);  // as int32 ids: the same 4 bytes a token
  if (ctx_.coords().pp > 0) {
    dev_.send(dev_.compute(), stage_peer_, kTokenTag, {reinterpret_cast<const std::byte*>(tokens.data()), bytes},
              bytes);
    return;
  }
  const Message m = dev_.recv(dev_.compute(), stage_peer_, kTokenTag);
  SHARDLAB_CHECK(m.payload.size() == bytes, "inference: the last stage sent another count of tokens");
  std::memcpy(tokens.data(), m.payload.data(), bytes);
}

}  // namespace shardlab::infer
