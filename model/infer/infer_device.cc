#include "model/infer/infer_device.h"

#include <algorithm>
#include <numeric>

#include "collectives/collectives.h"

namespace shardlab::infer {

namespace coll = collectives;

coll::DeviceMesh inference_mesh(int tp, int pp, int ep) {
  return coll::DeviceMesh(coll::MeshShape{tp, 1, ep, ep, pp});  // the ep ranks carry replicas of the batch
}

int sampler_rank(const coll::DeviceMesh& mesh) {
  for (int rank = 0; rank < mesh.size(); ++rank) {
    const coll::Coords c = mesh.coords(rank);
    if (c.tp == 0 && c.dp == 0 && c.pp == mesh.shape().pp - 1) return rank;
  }
  return 0;
}

EngineGroups InferDevice::groups(parallel::ParallelContext& ctx, bool ep) {
  const coll::ProcessGroup& pipeline = ctx.group("pp");
  return {&ctx.group("tp"), ep ? &ctx.group("ep") : nullptr,
          {pipeline.members().begin(), pipeline.members().end()}, ctx.coords().pp};
}

InferDevice::InferDevice(Device& dev, const coll::DeviceMesh& mesh, const model::GPTConfig& config, uint64_t seed,
                         const model::SafetensorsFile* init)
    : dev_(dev), ctx_(mesh, dev.rank()), engine_(config, seed, dev, groups(ctx_, mesh.shape().ep > 1), init),
      sampler_(sampler_rank(mesh)) {
  if (mesh.size() == 1) return;
  std::vector<int> everyone(size_t(mesh.size()));
  std::iota(everyone.begin(), everyone.end(), 0);
  world_ = &ctx_.group(everyone, "world");
}

std::vector<float> InferDevice::choose(const StepOutput& out, const std::vector<bool>& samples, Sampler& sampler) {
  const int64_t S = std::count(samples.begin(), samples.end(), true);
  std::vector<float> tokens(size_t(S), 0.0f);
  if (!is_sampler() || S == 0) return tokens;
  const model::GPTConfig& m = engine_.config();
  const double V = m.vocab_size;
  dev_.run(dev_.compute(), "sample", OpCost{5.0 * V * double(S), V * double(S) * element_size(dev_.precision())});
  if (out.logits.empty()) return tokens;  // phantom
  size_t k = 0;
  for (size_t i = 0; i < samples.size(); ++i)
    if (samples[i])
      tokens[k++] = float(sampler.next({out.logits.data() + i * size_t(m.vocab_size), size_t(m.token_vocab())}));
  return tokens;
}

void InferDevice::broadcast(std::vector<float>& tokens) {
  if (!world_ || tokens.empty()) return;
  coll::broadcast(dev_, *world_, coll::Buffer(tokens.data(), tokens.size()), sampler_, {.stream = &dev_.compute()});
}

}  // namespace shardlab::infer
