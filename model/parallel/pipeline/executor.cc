#include "model/parallel/pipeline/executor.h"

#include <cstring>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/fiber.h"

namespace shardlab::parallel {

namespace {

// Point-to-point tags of the pipeline (user range, below the collectives' bit 63).
constexpr Tag kActivationTag = 0x5050'4143'0000'0000ull;  // "PPAC"
constexpr Tag kGradTag = 0x5050'4752'0000'0000ull;        // "PPGR"

bool is_grad(ActionKind k) { return k == ActionKind::kSendGrad || k == ActionKind::kRecvGrad; }

}  // namespace

PipelineExecutor::PipelineExecutor(Device& dev, StageModel& model, std::vector<Action> actions,
                                   std::vector<int> pp_ranks, int micro_batches)
    : dev_(dev),
      model_(model),
      actions_(std::move(actions)),
      pp_ranks_(std::move(pp_ranks)),
      micro_batches_(micro_batches),
      p2p_(&dev, StreamKind::kPipeline) {
  SHARDLAB_CHECK(int(pp_ranks_.size()) == model.placement().pp, "one global rank per pipeline rank");
  final_.assign(actions_.size(), 0);
  std::vector<char> seen(size_t(model.placement().vpp), 0);
  for (size_t i = actions_.size(); i-- > 0;) {
    const Action& a = actions_[i];
    const bool backward = a.is_backward_input() || a.kind == ActionKind::kBackwardWeight;
    if (!backward || seen[size_t(a.chunk)]) continue;
    seen[size_t(a.chunk)] = 1;
    final_[i] = 1;
  }
}

void PipelineExecutor::send(const Action& a, const float* data) {
  const int64_t n = model_.boundary_elements();
  const int dst = pp_ranks_[size_t(a.peer)];
  if (dst == dev_.rank()) {  // a phantom tensor (data null) hands over nothing
    if (data) local_[is_grad(a.kind)].emplace_back(data, data + n);
    return;
  }
  // Scatter/gather: this rank's part of the tensor only (boundary_part()
  // counts only when the boundary is split).
  const int parts = model_.boundary_parts();
  const int64_t part = n / parts;
  if (data && parts > 1) data += model_.boundary_part() * part;
  const uint64_t bytes = uint64_t(part) * element_size(dev_.precision());
  p2p_.wait(dev_.compute().record());  // the tensor exists once the compute stream made it
  const SendHandle sent =
      dev_.isend(p2p_, dst, is_grad(a.kind) ? kGradTag : kActivationTag,
                 {reinterpret_cast<const std::byte*>(data), data ? size_t(part) * sizeof(float) : 0}, bytes);
  sent_bytes_ += bytes;
  // Not modeled either way: NCCL's rendezvous (a send leaves only once its
  // receiver has posted the receive); here the receiver buffers it.
  if (wait_sends_) dev_.compute().wait({sent.done});
}

void PipelineExecutor::recv(const Action& a, float* into) {
  const int64_t n = model_.boundary_elements();
  const int src = pp_ranks_[size_t(a.peer)];
  if (src == dev_.rank()) {
    if (!into) return;  // phantom
    auto& q = local_[is_grad(a.kind)];
    SHARDLAB_CHECK(!q.empty(), "pipeline: local receive before its send");
    std::copy(q.front().begin(), q.front().end(), into);
    q.pop_front();
    return;
  }
  p2p_.wait(dev_.compute().record());  // posted when the compute stream gets here
  Message m = dev_.recv(p2p_, src, is_grad(a.kind) ? kGradTag : kActivationTag);
  const int parts = model_.boundary_parts();
  const int64_t part = n / parts;
  const size_t expected = into ? size_t(part) * sizeof(float) : 0;  // phantom: no payload
  SHARDLAB_CHECK(m.payload.size() == expected,
                 fmt::format("pipeline: device {} sent {} bytes, expected {}", src, m.payload.size(),
                             expected));
  if (into) std::memcpy(into + (parts > 1 ? model_.boundary_part() * part : 0), m.payload.data(), m.payload.size());
  dev_.compute().wait(p2p_.record());
  model_.gather_boundary(into);  // scatter/gather: the TP group reassembles the tensor
}

void PipelineExecutor::execute(const Action& a, bool final,
                               const std::function<MicroBatchTokens(int mb)>& tokens) {
  const StagePlacement& place = model_.placement();
  const float dloss = 1.0f / float(micro_batches_);
  switch (a.kind) {
    case ActionKind::kForward: {
      MicroBatchTokens t;
      if (place.first(a.chunk) || place.last(a.chunk)) t = tokens(a.micro_batch);
      if (!place.first(a.chunk)) t.inputs = nullptr;
      if (!place.last(a.chunk)) t.targets = nullptr;
      model_.forward(a.chunk, a.micro_batch, a.buffer_id(), t);
      break;
    }
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      model_.backward_input(a.chunk, a.micro_batch, a.buffer_id(), dloss,
                            a.kind == ActionKind::kBackwardInput, final);
      break;
    case ActionKind::kBackwardWeight:
      model_.backward_weight(a.chunk, a.micro_batch, final);
      break;
    case ActionKind::kSendActivation:
      send(a, model_.output(a.chunk, a.micro_batch));
      break;
    case ActionKind::kRecvActivation:
      recv(a, model_.activation_buffer(a.chunk, a.buffer_id()));
      break;
    case ActionKind::kSendGrad:
      send(a, model_.input_grad(a.chunk, a.micro_batch));
      model_.release_input_grad(a.chunk, a.micro_batch);
      break;
    case ActionKind::kRecvGrad:
      recv(a, model_.gradient_buffer(a.chunk, a.buffer_id()));
      break;
  }
}

PipelinePhase PipelineExecutor::run(const std::function<MicroBatchTokens(int mb)>& tokens) {
  Stream& compute = dev_.compute();
  PipelinePhase phase;
  phase.start = compute.now();
  const Time busy0 = compute.busy();
  const uint64_t sent0 = sent_bytes_;
  spans_.clear();
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    const Time t0 = compute.now();
    if (a.paired) {
      SHARDLAB_CHECK(a.kind == ActionKind::kForward && i + 1 < actions_.size() &&
                         actions_[i + 1].kind == ActionKind::kBackward &&
                         actions_[i + 1].micro_batch != a.micro_batch,
                     "pipeline: a paired forward is followed by another micro-batch's backward");
      const Action& b = actions_[i + 1];  // another micro-batch's: independent of the forward
      Interleave::run([&] { execute(a, final_[i], tokens); }, [&] { execute(b, final_[i + 1], tokens); });
      spans_.push_back({a.kind, a.micro_batch, a.chunk, t0, compute.now()});
      spans_.push_back({b.kind, b.micro_batch, b.chunk, t0, compute.now()});
      if (on_action_) on_action_(i + 2, actions_.size());
      ++i;
      continue;
    }
    execute(a, final_[i], tokens);
    if (a.is_compute()) spans_.push_back({a.kind, a.micro_batch, a.chunk, t0, compute.now()});
    if (on_action_) on_action_(i + 1, actions_.size());
  }
  phase.end = compute.now();
  phase.busy = compute.busy() - busy0;
  phase.sent_bytes = sent_bytes_ - sent0;
  return phase;
}

}  // namespace shardlab::parallel
