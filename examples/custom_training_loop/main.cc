// custom_training_loop: the tiny GPT trained with data parallelism on 2 virtual A100s over
// the public API: the model (GPT<float>), the data (BatchSampler), the gradient all-reduce,
// global-norm clipping, AdamW. It is the built-in trainer's pure-DP step (`shardlab train
// --dp 2`) spelled out (tiny's 3.5 MB of gradients fill one of its 25 MB buckets): losses
// and virtual times match that run's bit for bit (tests/examples/custom_training_loop).
//   build/bin/custom_training_loop [STEPS [LR]]    (default 30 steps, lr 1e-3)
// Exit code: 0 when the loss fell (the last below 90% of the first; not with LR 0), 1 when
// it did not, 2 on bad arguments.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "model/gpt.h"
#include "model/io/data.h"
#include "model/optimizer.h"
#include "model/engine/device_sink.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"

using namespace shardlab;
namespace coll = shardlab::collectives;

constexpr int kDp = 2;            // data-parallel replicas, one per virtual GPU
constexpr uint64_t kSeed = 1337;  // the parameters' init and the batches

struct Log {
  std::vector<float> loss;        // (steps) the replicas' mean loss
  std::vector<Time> virtual_end;  // (steps) device 0's clock after the step
};

// One replica: its rows of every global batch, forward, backward, the
// gradients averaged over the replicas, then the same AdamW step everywhere.
void replica(Device& dev, const model::BatchSampler& data, int steps, double lr, Log& log) {
  const model::GPTConfig cfg = model::preset("tiny");
  model::GPT<float> gpt(cfg, kSeed);  // every replica starts from the same weights
  engine::DeviceSink sink(dev);        // kernels charge the device's compute stream
  gpt.set_sink(&sink);
  const coll::ProcessGroup dp = coll::ProcessGroup::world(dev);
  const auto n = int64_t(gpt.params().size());
  std::vector<float> m(gpt.params().size()), v(m.size());  // AdamW moments
  const int64_t rows = cfg.batch_size / kDp;
  const model::AdamWHyper hyper{.lr = lr};
  for (int step = 0; step < steps; ++step) {
    const model::Batch b = data.batch_rows(step, dev.rank() * rows, (dev.rank() + 1) * rows);
    gpt.zero_grad();
    const float loss = gpt.forward(b.x.data(), b.y.data(), int(rows), cfg.block_size);
    gpt.backward();
    coll::all_reduce(dev, dp, coll::Buffer(gpt.grads()), coll::ReduceOp::kAvg);  // DDP
    float logged[3] = {loss, gpt.ce_loss(), gpt.aux_loss()};  // what the trainer logs, dp mean
    coll::all_reduce(dev, dp, coll::Buffer(logged, 3), coll::ReduceOp::kAvg);
    double sq = 0;  // the global norm, tensor by tensor in double
    for (const model::ParamSpec& s : gpt.table().specs())
      sq += model::sum_squares(&gpt.grads()[size_t(s.offset)], s.numel);
    dev.run(dev.compute(), "grad_norm", model::sum_squares_cost(n, 4));
    const double clip = 1.0 / (std::sqrt(sq) + 1e-6);  // torch's clip_grad_norm_(max_norm=1)
    if (clip < 1) {
      model::scale_inplace(gpt.grads().data(), float(clip), n);
      dev.run(dev.compute(), "grad_clip", model::scale_inplace_cost(n, 4));
    }
    for (const model::ParamSpec& s : gpt.table().specs()) {  // weight decay on 2-D tensors only
      const auto at = size_t(s.offset);
      model::adamw_update(&gpt.params()[at], &m[at], &v[at], &gpt.grads()[at], s.numel, hyper,
                          s.decay() ? hyper.weight_decay : 0.0, step + 1);
    }
    dev.run(dev.compute(), "adamw", model::adamw_update_cost(n, 4));
    if (dev.rank() == 0) log.loss.push_back(logged[0]), log.virtual_end.push_back(dev.now());
  }
}

int main(int argc, char** argv) try {
  int steps = 30;
  double lr = 1e-3;
  char extra = 0;  // a character after the number makes sscanf return 2
  if (argc > 3 || (argc > 1 && std::sscanf(argv[1], "%6d%c", &steps, &extra) != 1) ||
      (argc > 2 && std::sscanf(argv[2], "%lf%c", &lr, &extra) != 1) || steps < 2 ||
      !(lr >= 0 && lr < 1))
    throw ConfigError(
        "usage: custom_training_loop [STEPS [LR]], STEPS in [2, 999999], LR in [0, 1)");
  const model::GPTConfig cfg = model::preset("tiny");
  const model::BatchSampler data(std::make_shared<const model::TokenData>(model::open_token_data(
                                     "synthetic:markov", cfg.token_vocab(), cfg.block_size, kSeed)),
                                 cfg.batch_size, cfg.block_size, model::Sampling::kRandom, kSeed);
  Log log;
  Cluster(load_profile("a100-nvlink"), {.world_size = kDp}).run([&](Device& dev) {
    replica(dev, data, steps, lr, log);
  });
  for (int s = 0; s < steps; ++s)  // %.9g: a float's every bit; %.9f ms: to the picosecond
    std::printf("step %4d loss %.9g virtual %.9f ms\n", s, log.loss[size_t(s)],
                to_us(log.virtual_end[size_t(s)]) / 1e3);
  const bool fell = log.loss.back() < 0.9f * log.loss.front();
  std::printf("%s: loss %.4f -> %.4f over %d steps of DP %d\n", fell ? "PASS" : "FAIL",
              log.loss.front(), log.loss.back(), steps, kDp);
  return fell ? 0 : 1;
} catch (const std::exception& e) {  // bad arguments (ConfigError): 2; a failed run: 1
  std::fprintf(stderr, "custom_training_loop: error: %s\n", e.what());
  return dynamic_cast<const ConfigError*>(&e) ? 2 : 1;
}
