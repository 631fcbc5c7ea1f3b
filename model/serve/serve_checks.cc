#include "model/serve/serve_checks.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/params.h"
#include "runtime/errors.h"
#include "runtime/units.h"

namespace shardlab::serve {

void check_requests(const model::GPTConfig& model, const std::vector<Request>& requests,
                    const RequestSource& source) {
  for (const Request& r : requests)
    for (size_t i = 0; i < r.prompt.size(); ++i)
      if (r.prompt[i] >= model.token_vocab())
        throw ConfigError(fmt::format("`workload` {}: request {}: token {} at position {} is outside the vocabulary "
                                      "[0, {})", source.workload, r.id, r.prompt[i], i, model.token_vocab()));
  for (const Request& r : requests)
    if (r.prompt_len + r.output_len - 1 > model.block_size)
      throw ConfigError(fmt::format(
          "request {}: prompt {} + output {} - 1 tokens exceed the model's context of {} (`block_size`){}", r.id,
          r.prompt_len, r.output_len, model.block_size,
          source.workload.empty() && source.default_len > 0
              ? fmt::format("; `prompt_len` and `output_len` are {} unless given: give lengths that fit",
                            source.default_len)
              : ""));
}

void check_host_memory(const ReplicaShape& shape, size_t requests, int max_seqs, uint64_t host_memory,
                       int64_t handed_tokens, int replicas) {
  const double running = double(std::min<size_t>(requests, size_t(max_seqs)));
  // fp32 weights and a context of K and V per running sequence (on each ep replica), of a model
  auto held = [&](const model::GPTConfig& m) {
    return 4.0 * double(model::count_params(m)) + 2.0 * m.n_layer * m.n_embd * m.block_size * 4 * shape.ep * running;
  };
  double need = held(shape.model);
  if (shape.speculative) need += held(shape.speculative->draft);
  need = need * replicas + 2.0 * shape.model.n_layer * shape.model.n_embd * 4 * double(handed_tokens);
  if (need > double(host_memory / 10 * 8))
    throw ConfigError(fmt::format("a run on the model's values needs at least {} of host memory (fp32 weights, and "
                                  "a context of K and V for each of {} running sequences, the draft model's too, and the K and V handed "
                                  "from prefill to decode replicas), this machine has {}: use "
                                  "a smaller model or `max_seqs`, or `phantom` to time it on shapes only",
                                  format_bytes(uint64_t(std::min(need, 1.8e19))), int64_t(running),
                                  format_bytes(host_memory)));
}

}  // namespace shardlab::serve
