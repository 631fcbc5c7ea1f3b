// Sharded checkpoints and resume (model/train/checkpoint.h).
//
// Resume under the same parallel config must be bit-identical to the run that
// never stopped: 10 steps straight against 5, a checkpoint, and 5 more from
// it (the losses, every step's virtual time, the devices' clocks and busy
// totals, the final parameters and the AdamW state of the step-10
// checkpoints). Resume under another parallel config reshards; it must match
// the unsharded run within verify's tolerance (1e-5 on the per-step loss and
// on the parameter vector's relative L2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/params.h"
#include "model/train/checkpoint.h"
#include "model/train/verify.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

namespace fs = std::filesystem;
using testing::run;
using testing::small_options;
using testing::unsharded;

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / ("ckpt_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(d);
  return d.string();
}

// As if the run had died right after step `step`'s checkpoint: later
// checkpoints gone, `latest` pointing at it.
void roll_back_to(const std::string& dir, int step) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string() > checkpoint_name(step)) fs::remove_all(e.path());
  std::ofstream(fs::path(dir) / "latest") << checkpoint_name(step) << "\n";
}

// The unsharded state of `dir`'s latest checkpoint, read for a run of `o`.
ResumeState read_state(TrainOptions o, const std::string& dir) {
  o.resume_dir = dir;
  return load_checkpoint(o, model::ParamTable(o.model));
}

TrainOptions ten_steps(TrainOptions o) {
  o.steps = 10;
  o.warmup_steps = 2;
  o.lr_schedule = LrSchedule::kCosine;  // depends on the total: resume must keep --steps as the total
  return o;
}

void expect_bit_identical_resume(TrainOptions o, const std::string& what) {
  o = ten_steps(o);
  const TrainResult plain = run(o);
  TrainOptions a = o;
  a.checkpoint_dir = fresh_dir(what + "_a");
  a.checkpoint_every = 5;
  const TrainResult straight = run(a);
  TrainOptions b = a;
  b.checkpoint_dir = fresh_dir(what + "_b");
  fs::copy(a.checkpoint_dir, b.checkpoint_dir, fs::copy_options::recursive);
  roll_back_to(b.checkpoint_dir, 5);
  b.resume_dir = b.checkpoint_dir;
  const TrainResult resumed = run(b);

  ASSERT_EQ(resumed.steps.size(), 10u) << what;
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(straight.steps[i].loss, plain.steps[i].loss) << what << " step " << i << ": checkpointing changed it";
    EXPECT_EQ(resumed.steps[i].step, int(i)) << what;
    EXPECT_EQ(resumed.steps[i].loss, straight.steps[i].loss) << what << " step " << i;
    EXPECT_EQ(resumed.steps[i].grad_norm, straight.steps[i].grad_norm) << what << " step " << i;
    EXPECT_EQ(resumed.steps[i].virtual_end, straight.steps[i].virtual_end) << what << " step " << i;
    EXPECT_EQ(straight.steps[i].virtual_end, plain.steps[i].virtual_end) << what << ": a checkpoint takes no virtual time";
  }
  testing::expect_same_device_times(resumed.run, straight.run, what);
  EXPECT_EQ(resumed.final_params, straight.final_params) << what;
  const ResumeState s = read_state(o, a.checkpoint_dir), r = read_state(o, b.checkpoint_dir);
  EXPECT_EQ(s.step, 10);
  EXPECT_EQ(r.step, 10);
  EXPECT_EQ(r.params, s.params) << what;
  EXPECT_EQ(r.exp_avg, s.exp_avg) << what << ": AdamW m";
  EXPECT_EQ(r.exp_avg_sq, s.exp_avg_sq) << what << ": AdamW v";
  EXPECT_EQ(r.params, resumed.final_params) << what << ": the checkpoint holds the final parameters";
  std::printf("%s: 10 steps = 5 + 5 resumed, bit for bit (final loss %.7f, virtual %lld ps)\n", what.c_str(),
              resumed.steps.back().loss, static_cast<long long>(resumed.steps.back().virtual_end));
}

TEST(CheckpointResume, DenseTp2Pp2IsBitIdentical) {
  TrainOptions o = small_options();
  o.parallel.tp = 2, o.parallel.pp = 2, o.micro_batches = 2;
  expect_bit_identical_resume(o, "dense_tp2_pp2");
}

TEST(CheckpointResume, MoeDp2Zero2IsBitIdentical) {
  TrainOptions o = small_options(4);
  o.parallel.dp = 2, o.parallel.zero = 2, o.parallel.ep = 2;
  expect_bit_identical_resume(o, "moe_dp2_ep2_zero2");
}

TEST(CheckpointResume, DenseDp2Zero2AndTheUnshardedModelAreBitIdentical) {
  TrainOptions o = small_options();
  expect_bit_identical_resume(o, "dense_1gpu");
  o.parallel.dp = 2, o.parallel.zero = 2;
  expect_bit_identical_resume(o, "dense_dp2_zero2");
}

// ZeRO-3 keeps only each rank's owned chunks of the parameters between
// steps (the rest is dropped, NaN): each rank writes its chunks. Until
// session 34 dp rank 0 wrote its whole shards, NaNs included, and every
// resumed step's loss was NaN (found by tools/fuzz_configs.py --mode resume).
TEST(CheckpointResume, Zero3IsBitIdentical) {
  TrainOptions o = small_options();
  o.parallel.dp = 2, o.parallel.zero = 3;
  expect_bit_identical_resume(o, "dense_dp2_zero3");
  o.parallel.pp = 2, o.parallel.tp = 2, o.micro_batches = 2;  // units on two stages, tp shards
  expect_bit_identical_resume(o, "dense_tp2_pp2_dp2_zero3");
}

// 5 steps under `from`, then 5 more resumed under `to`, against 10 steps of
// the unsharded model. Returns the checkpoint directory.
std::string expect_resharded_resume(TrainOptions from, TrainOptions to, const std::string& what) {
  from = ten_steps(from);
  to = ten_steps(to);
  from.checkpoint_dir = fresh_dir(what);
  from.checkpoint_every = 5;
  from.steps = 10;
  run(from);
  roll_back_to(from.checkpoint_dir, 5);
  to.resume_dir = from.checkpoint_dir;
  const TrainResult resumed = run(to);
  TrainOptions straight = unsharded(to);
  straight.resume_dir.clear();  // the reference never stopped
  const TrainResult reference = run(straight);
  const VerifyResult v = compare_runs(resumed, reference, model::ParamTable(to.model), {});
  std::printf("%s: max loss rel diff %.3e, parameter rel L2 %.3e, max |diff| %.3e (tolerance 1e-5)\n", what.c_str(),
              v.max_loss_rel_diff, v.param_rel_l2, v.max_param_abs_diff);
  EXPECT_TRUE(v.passed) << what;
  EXPECT_TRUE(resumed.replica_mismatch.empty()) << what << ": " << resumed.replica_mismatch;
  // The step-5 records come from the checkpoint, the rest from this run.
  EXPECT_EQ(resumed.steps.size(), 10u) << what;
  if (resumed.steps.size() == 10u) {
    EXPECT_LE(resumed.steps[4].virtual_end, resumed.steps[5].virtual_end) << what << ": the clock goes on";
  }
  return from.checkpoint_dir;
}

TEST(CheckpointReshard, Tp2Pp2ToDp4) {
  TrainOptions from = small_options(), to = small_options();
  from.parallel.tp = 2, from.parallel.pp = 2, from.micro_batches = 2;
  to.parallel.dp = 4;
  to.micro_batches = 2;  // the reference keeps M: the same micro-batch means
  expect_resharded_resume(from, to, "tp2_pp2_to_dp4");
}

TEST(CheckpointReshard, Zero2ToZero0) {
  TrainOptions from = small_options(), to = small_options();
  from.parallel.dp = 2, from.parallel.zero = 2;
  to.parallel.dp = 2;
  expect_resharded_resume(from, to, "dp2_zero2_to_zero0");
}

TEST(CheckpointReshard, Ep2ToEp1) {
  TrainOptions from = small_options(4), to = small_options(4);
  from.parallel.dp = 2, from.parallel.ep = 2, from.parallel.zero = 1;
  to.parallel.dp = 2;
  expect_resharded_resume(from, to, "moe_dp2_ep2_zero1_to_ep1");
}

TEST(CheckpointReshard, AnotherPipelineSplit) {
  TrainOptions from = small_options(), to = small_options();
  from.parallel.pp = 2, from.parallel.stage_layers = {1, 3}, from.micro_batches = 2;
  to.parallel.pp = 2, to.parallel.stage_layers = {3, 1}, to.parallel.tp = 2, to.micro_batches = 2;
  expect_resharded_resume(from, to, "pp2_layers_1_3_to_tp2_pp2_layers_3_1");
}

// The llama family: the checkpoint holds Hugging Face's names and [out, in]
// layouts (model.layers.{i}.self_attn.k_proj.weight, ...), and resuming
// reshards them. 10 steps of the real presets (tiny-llama: 4 query heads over
// 2 K/V heads; tiny-moe: block 0 dense, blocks 1-3 with 8 routed + 1 shared
// SwiGLU experts, top-2).
TrainOptions llama_options(const char* preset) {
  TrainOptions o;
  o.model = model::preset(preset);
  o.steps = 3;
  return o;
}

// The global shape the latest checkpoint of `dir` records for tensor `name`
// (empty if it has none).
std::vector<int64_t> checkpoint_shape(const std::string& dir, const std::string& name) {
  std::string latest;
  std::ifstream(fs::path(dir) / "latest") >> latest;
  const nlohmann::json index = nlohmann::json::parse(std::ifstream(fs::path(dir) / latest / "index.json"));
  if (!index.at("tensors").contains(name)) return {};
  return index["tensors"][name].at("shape").get<std::vector<int64_t>>();
}

// tp 2 splits the 2 K/V heads (one per rank); tp 4 replicates them (kv heads
// < tp, Megatron's rule): every rank of the new run takes the whole k_proj
// and v_proj from the checkpoint.
TEST(CheckpointReshard, TinyLlamaTp2ToTp4ReplicatesKv) {
  TrainOptions from = llama_options("tiny-llama"), to = llama_options("tiny-llama");
  ASSERT_EQ(from.model.kv_heads(), 2);
  from.parallel.tp = 2;
  to.parallel.tp = 4;
  const std::string dir = expect_resharded_resume(from, to, "tiny_llama_tp2_to_tp4");
  // Hugging Face's names and torch.nn.Linear's [out, in]: K and V have 2
  // heads of 32 rows, Q and O all 128; SwiGLU's gate/up are [352, 128].
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(checkpoint_shape(dir, "model.embed_tokens.weight"), (Shape{512, 128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.0.self_attn.q_proj.weight"), (Shape{128, 128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.3.self_attn.k_proj.weight"), (Shape{64, 128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.3.self_attn.v_proj.weight"), (Shape{64, 128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.1.mlp.gate_proj.weight"), (Shape{352, 128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.1.mlp.down_proj.weight"), (Shape{128, 352}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.2.post_attention_layernorm.weight"), (Shape{128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.norm.weight"), (Shape{128}));
  EXPECT_EQ(checkpoint_shape(dir, "lm_head.weight"), (Shape{512, 128}));
}

TEST(CheckpointReshard, TinyLlamaPp2ToUnsharded) {
  TrainOptions from = llama_options("tiny-llama"), to = llama_options("tiny-llama");
  from.parallel.pp = 2, from.micro_batches = 2;
  to.micro_batches = 2;  // the reference keeps M: the same micro-batch means
  expect_resharded_resume(from, to, "tiny_llama_pp2_to_1gpu");
}

// tiny-moe (aux-loss-free balancing at `router_bias_rate` when > 0): 5 steps
// under dp 2 with ep 2 and ZeRO-1, resumed under dp 2 alone. Returns the
// checkpoint directory.
std::string tiny_moe_ep2_to_ep1(double router_bias_rate, const std::string& what) {
  TrainOptions from = llama_options("tiny-moe"), to = llama_options("tiny-moe");
  for (TrainOptions* o : {&from, &to}) o->model.router_bias_rate = router_bias_rate;
  from.parallel.dp = 2, from.parallel.ep = 2, from.parallel.zero = 1;
  to.parallel.dp = 2;
  return expect_resharded_resume(from, to, what);
}

TEST(CheckpointReshard, TinyMoeEp2ToEp1) {
  const std::string dir = tiny_moe_ep2_to_ep1(0, "tiny_moe_dp2_ep2_zero1_to_ep1");
  // DeepSeek-V3's Hugging Face layout: the router is mlp.gate, routed experts
  // mlp.experts.{e}, the shared one mlp.shared_experts; block 0 is dense.
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.1.mlp.gate.weight"), (Shape{8, 128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.3.mlp.experts.7.up_proj.weight"), (Shape{64, 128}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.2.mlp.shared_experts.down_proj.weight"), (Shape{128, 64}));
  EXPECT_EQ(checkpoint_shape(dir, "model.layers.0.mlp.gate_proj.weight"), (Shape{352, 128}));
}

// With aux-loss-free balancing the selection biases
// (model.layers.{i}.mlp.gate.e_score_correction_bias) are model state the
// steps change: the resumed run must start from the checkpoint's, not zeros.
// Expert TP 1 (--expert-tp 1): every TP rank holds whole experts of its
// own place in tp x dp and writes them; the resumed run is the uninterrupted
// one bit for bit, and a checkpoint of whole experts reshards into experts
// split over TP (and back), with aux-loss-free balancing's biases (summed
// over TP as the router's gradients are).
TEST(CheckpointResume, TinyMoeWholeExpertsIsBitIdentical) {
  TrainOptions o = llama_options("tiny-moe");
  o.model.router_bias_rate = 1e-3;
  o.parallel.tp = 2, o.parallel.sp = true, o.parallel.dp = 2, o.parallel.ep = 4, o.parallel.expert_tp = 1;
  o.parallel.zero = 1, o.parallel.distributed_optimizer = true;
  expect_bit_identical_resume(o, "tiny_moe_tp2_ep4_expert_tp1");
}

TEST(CheckpointReshard, TinyMoeWholeExpertsToSplitExperts) {
  TrainOptions from = llama_options("tiny-moe"), to = llama_options("tiny-moe");
  for (TrainOptions* o : {&from, &to}) o->model.router_bias_rate = 1e-3;
  from.parallel.tp = 2, from.parallel.sp = true, from.parallel.dp = 2, from.parallel.ep = 4;
  from.parallel.expert_tp = 1;
  to.parallel.tp = 2, to.parallel.sp = true, to.parallel.dp = 2, to.parallel.ep = 2;
  expect_resharded_resume(from, to, "tiny_moe_expert_tp1_to_split");
  expect_resharded_resume(to, from, "tiny_moe_split_to_expert_tp1");
}

TEST(CheckpointReshard, TinyMoeRouterBiasEp2ToEp1) {
  const std::string dir = tiny_moe_ep2_to_ep1(1e-2, "tiny_moe_router_bias_dp2_ep2_zero1_to_ep1");
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  EXPECT_EQ(checkpoint_shape(dir, bias), (std::vector<int64_t>{8}));
  // 5 steps of ±rate moved it off zero: the case tests the state, not the init.
  TrainOptions o = ten_steps(llama_options("tiny-moe"));
  o.model.router_bias_rate = 1e-2;
  const model::ParamTable table(o.model);
  const ResumeState s = read_state(o, dir);
  const model::ParamSpec& spec = table.at(bias);
  double moved = 0;
  for (int64_t i = 0; i < spec.numel; ++i) moved = std::max(moved, double(std::abs(s.params[size_t(spec.offset + i)])));
  std::printf("router bias after 5 steps: max |b| %.3e (rate 1e-2)\n", moved);
  EXPECT_GT(moved, 0.0);
}

}  // namespace
}  // namespace shardlab::train
