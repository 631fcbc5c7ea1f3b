// Folding (model/engine/fold.h): ranks that provably run the same program
// from the same state are played by one thread, and no figure changes. Each
// configuration runs phantom, folded and unfolded; the folded run must keep
// the folding it is expected to keep and give every per-device figure of the
// unfolded one, bit for bit.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/train/parallel_plan.h"
#include "model/train/preflight.h"
#include "tests/model/train/phantom_util.h"

namespace shardlab::train {
namespace {

using namespace phantom_testing;

// Megatron-core's weak-scaling shape in small (calibration.cc,
// megatron_core_weak_scaling_h100): tp 8 fills an h100-nvlink node, SP,
// the distributed optimizer (gradients reduce-scattered) with the
// parameters gathered in the forward, bf16, two steps, on `nodes` nodes,
// `running` threads folded.
void mcore_small(Config& c, int nodes, int running) {
  c.options.model.n_head = 8;
  c.options.parallel.sp = true;
  c.options.parallel.zero = 1;
  c.options.parallel.distributed_optimizer = true;
  c.options.parallel.overlap_param_gather = true;
  c.options.parallel.bucket_mb = 0.02;
  c.options.steps = 2;
  c.precision = Precision::kBf16;
  c.profile = "h100-nvlink";
  c.nodes = nodes;
  c.running = running;
}

// Folded configurations: each is run folded and unfolded (both phantom).
std::vector<Config> fold_configs() {
  return {
      make("tp4_sp_pp2_dp2", 4, 2, 2, 2, [](Config& c) {
        c.options.parallel.sp = true;
        c.nodes = 2;
      }),
      make("tp2_pp2_dp2_interleaved_bf16", 2, 2, 2, 4, [](Config& c) {
        c.options.parallel.schedule = parallel::ScheduleKind::kInterleaved;
        c.options.parallel.vpp = 2;
        c.precision = Precision::kBf16;
      }),
      // ZeRO-2 sums the tied wte's two pipeline copies over each dp rank's
      // chunk of its padded bucket (device_program.cc sum_tied_copies):
      // 25 x 16 = 400 elements padded to 512, so dp rank 0's chunk is all
      // real and dp rank 1's 144 real and 112 padding. Summed at the
      // chunk's padded size, every dp rank runs the same program (summed
      // over the real part only, rank 1 sent 576 B where rank 0 sent 1 KiB,
      // and the folded run ended its second step 322 ps early:
      // tools/fuzz_configs.py --mode fold --seed 301).
      make("pp2_dp2_zero2_tied_wte_in_padded_chunks", 1, 2, 2, 6, [](Config& c) {
        c.options.model.vocab_size = 25;
        c.options.model.n_embd = 16;
        c.options.model.n_head = 2;
        c.options.model.n_layer = 4;
        c.options.model.block_size = 8;
        c.options.model.batch_size = 24;
        c.options.parallel.zero = 2;
        c.running = 2;
      }),
      // dp 3 over three nodes (tp 8 fills a node), uneven buckets.
      make("tp8_dp3_nodes3", 8, 1, 3, 1, [](Config& c) {
        c.options.model.n_head = 8;
        c.options.model.batch_size = 12;
        c.options.parallel.bucket_mb = 0.01;
        c.options.parallel.recompute = parallel::Recompute::kFull;
        c.nodes = 3;
      }),
      // As the calibration runs (calibration.cc): no SP, scatter/gather, dropout.
      make("tp4_pp2_dp2_scatter_gather_dropout", 4, 2, 2, 2, [](Config& c) {
        c.options.parallel.scatter_gather = true;
        c.options.model.dropout = 0.1;
        c.nodes = 2;
      }),
      // The data-parallel all-reduce (dp 8 spans two nodes) overlaps the
      // backward and shares each NIC with the pipeline's sends (stage 1 is
      // on the next two nodes), and the ring's NVLink hops inside each node
      // share with the tensor-parallel all-reduces of the backward: the
      // replay books every member's transfers on copies of the ports
      // (folded.cc), so dp folds by place (4 local places x 2 stages) and
      // tp folds: 8 threads, the unfolded run's figures.
      make("tp2_pp2_dp8_overlap_shares_the_nic", 2, 2, 8, 4, [](Config& c) {
        c.options.model.batch_size = 64;
        c.options.parallel.bucket_mb = 0.01;
        c.nodes = 4;
        c.running = 8;
      }),
      // The same under ZeRO-1: the overlapped gradient reduce-scatter (comm
      // stream) against the pipeline's sends on the NIC.
      make("tp2_pp2_dp8_zero1_overlap_shares_the_nic", 2, 2, 8, 4, [](Config& c) {
        c.options.model.batch_size = 64;
        c.options.parallel.bucket_mb = 0.01;
        c.options.parallel.zero = 1;
        c.nodes = 4;
        c.running = 8;
      }),
      // ZeRO-1/2/3 with every bucket divisible by dp (the tiny model's tensors
      // all have sizes divisible by 4): the owned chunks differ in which
      // elements only, so dp folds too.
      make("tp2_dp4_zero1_even", 2, 1, 4, 1, [](Config& c) {
        c.options.parallel.zero = 1;
        c.options.parallel.bucket_mb = 0.01;
      }),
      make("tp2_pp2_dp2_zero2_bf16_even", 2, 2, 2, 2, [](Config& c) {
        c.options.parallel.zero = 2;
        c.options.parallel.bucket_mb = 0.02;
        c.precision = Precision::kBf16;
      }),
      make("pp2_dp4_zero3_even", 1, 2, 4, 2, [](Config& c) { c.options.parallel.zero = 3; }),
      // Expert parallelism under uniform phantom routing: 4 experts, top-2,
      // 64 tokens per rank, 32 rows per expert; the ep ranks fold with dp.
      make("dp4_ep4_moe_uniform", 1, 1, 4, 1, [](Config& c) {
        c.options.model.n_expert = 4;
        c.options.model.aux_coef = 0.01;
        c.options.parallel.ep = 4;
      }),
      make("pp2_dp4_ep2_zero1_moe_uniform_bf16", 1, 2, 4, 2, [](Config& c) {
        c.options.model.n_expert = 4;
        c.options.model.aux_coef = 0.01;
        c.options.parallel.ep = 2;
        c.options.parallel.zero = 1;
        c.precision = Precision::kBf16;
      }),
      // Context parallelism: the cp ranks fold with tp and dp; the
      // representative's ring sends stand for its members' (cp_attention.h).
      make("cp2_tp2_sp_dp2_zero1", 2, 1, 2, 1, [](Config& c) {
        c.options.parallel.cp = 2;
        c.options.parallel.sp = true;
        c.options.parallel.zero = 1;
        c.running = 1;
      }),
      make("cp4_dp2_pp2_ring", 1, 2, 2, 2, [](Config& c) {
        c.options.parallel.cp = 4;
        c.nodes = 2;  // a stage per node
        c.running = 2;
      }),
      make("cp2", 1, 1, 1, 1, [](Config& c) {
        c.options.parallel.cp = 2;
        c.running = 1;
      }),
      make("cp2_dp2", 1, 1, 2, 1, [](Config& c) {
        c.options.parallel.cp = 2;
        c.running = 1;
      }),
      make("cp2_tp2_pp2", 2, 2, 1, 2, [](Config& c) {
        c.options.parallel.cp = 2;
        c.running = 2;  // a thread per stage
      }),
      make("cp2_dp2_zero1_overlap_param_gather_bf16", 1, 1, 2, 2, [](Config& c) {
        c.options.parallel.cp = 2;
        c.options.parallel.zero = 1;
        c.options.parallel.overlap_param_gather = true;
        c.options.parallel.bucket_mb = 0.02;
        c.precision = Precision::kBf16;
        c.running = 1;
      }),
      // The all-gather variant: its ranks take the blocks in rank order
      // (cp_attention_test.cc), so cp stays unfolded; dp folds.
      make("cp2_dp2_allgather", 1, 1, 2, 1, [](Config& c) {
        c.options.parallel.cp = 2;
        c.options.parallel.cp_comm = parallel::CpComm::kAllGather;
        c.running = 2;
      }),
      // cp over two nodes, two members on each (tp 4 x cp 4: cp group
      // {0, 4, 8, 12}): the ring's hops 0->1 and 2->3 are NVLink, 1->2 and
      // 3->0 the NIC, so cp folds by place: cp ranks 0 and 1 run, cp rank 1
      // sends on behalf of cp rank 3 to cp rank 0.
      make("cp4_tp4_sp_two_nodes_by_place", 4, 1, 1, 2, [](Config& c) {
        c.options.parallel.cp = 4;
        c.options.parallel.sp = true;
        c.nodes = 2;
        c.running = 2;
      }),
      // One cp member per node (tp 8 fills it, as the 405B rows): every hop
      // crosses the NIC, which the dp reduce-scatter shares: one thread.
      make("cp2_tp8_dp2_zero1_nodes4", 8, 1, 2, 2, [](Config& c) {
        c.options.model.n_head = 8;
        c.options.parallel.cp = 2;
        c.options.parallel.zero = 1;
        c.options.parallel.bucket_mb = 0.01;
        c.nodes = 4;
        c.running = 1;
      }),
      // A PCIe box (a100-pcie-8): the ring 0..7 crosses the sockets' 16 GB/s
      // link at 3->4 and 7->0, its other hops run at 32 GB/s, so cp rank 1
      // would receive faster than its representative: the ring check refuses
      // (FoldingError; the gradients' all-reduce over the PCIe tree would
      // too) and the run falls back, unfolded, to the same figures.
      make("cp8_pcie_sockets_unfolded", 1, 1, 1, 1, [](Config& c) {
        c.options.parallel.cp = 8;
        c.profile = "a100-pcie-8";
        c.folds = false;
      }),
      // Meta's Clos (h100-roce: two nodes per rack): cp 4 over nodes 0..3
      // crosses racks at 1->2 and 3->0 (one switch tier more: +1 us), so cp
      // ranks 1 and 3 would send later than cp rank 0: the ring check
      // refuses cp and the run keeps tp folded (a thread per cp rank).
      make("cp4_tp8_roce_across_racks", 8, 1, 1, 1, [](Config& c) {
        c.options.model.n_head = 8;
        c.options.parallel.cp = 4;
        c.profile = "h100-roce";
        c.precision = Precision::kBf16;
        c.nodes = 4;
        c.running = 4;
      }),
      // Megatron-core's pipelined weak-scaling rows in small (calibration.cc,
      // megatron_core_weak_scaling_h100: tp 8 fills a node, dp over nodes,
      // the distributed optimizer, the parameters gathered in the forward,
      // interleaved):
      // the global norm's all-gather of one value per rank over tp-dp (two
      // nodes per stage, direct) ends 3.52 ns later on tp rank 1 than on
      // tp rank 0 (it takes its peers over NVLink and the NIC in another
      // order), so neither the full fold nor tp alone is exact (before
      // session 24 the run fell back to 32 threads); dp alone is: a thread
      // per local place and stage, each playing its twin on the stage's
      // other node, 16 threads with the unfolded run's figures.
      make("tp8_sp_pp2_dp2_distopt_norm_over_two_nodes", 8, 2, 2, 4, [](Config& c) {
        mcore_small(c, 4, 16);
        c.options.parallel.schedule = parallel::ScheduleKind::kInterleaved;
        c.options.parallel.vpp = 2;
      }),
      // The same rows without a pipeline (7.1B to 32B): the norm is one
      // 1-element all-reduce over tp-dp (tree: recursive halving and
      // doubling, every member's partners relative to it, so the twins a
      // node apart meet alike), which ends 3.70 us later on tp rank 1 than
      // on tp rank 0: 16 threads before session 24, 8 now.
      make("tp8_sp_dp2_distopt_norm_tree_over_two_nodes", 8, 1, 2, 1, [](Config& c) { mcore_small(c, 2, 8); }),
      // Groups over several nodes with several members on each (fold.h):
      // dp 8 x tp 2 puts devices 0, 2, 4, 6 of two nodes in each dp group.
      make("tp2_dp8_zero1_two_nodes", 2, 1, 8, 1, [](Config& c) {
        c.options.parallel.zero = 1;
        c.options.model.batch_size = 16;
        c.nodes = 2;
      }),
      // NVLink SHARP (collectives/nvls.cc): tp 8's activation all-reduces, 4
      // MiB of bf16 each, run as nvls on h100-nvlink (auto's pick); a
      // lock-step exchange, which the folded replay plays as the direct ones.
      make("tp8_dp2_nvls_h100", 8, 1, 2, 1, [](Config& c) {
        c.options.model.n_embd = 1024;
        c.options.model.n_head = 8;
        c.options.model.n_layer = 2;
        c.options.model.block_size = 512;
        c.options.steps = 1;
        c.precision = Precision::kBf16;
        c.profile = "h100-nvlink";
        c.nodes = 2;
      }),
      // A replica's other groups must sit on the nodes as its
      // representative's do: tp 3 x pp 2 x dp 2 on two 8-GPU nodes puts dp
      // rank 0's second-stage tp group on devices 6, 7 | 8 (two nodes) and
      // dp rank 1's on 9, 10, 11 (one), and their pipeline groups on 0 | 6
      // and 3 | 9 (one node, two). Folding dp reported the first's times
      // for the second (426 ps off in a step) until session 34
      // (tools/fuzz_configs.py --mode fold); now nothing folds.
      make("tp3_pp2_dp2_tp_group_over_two_nodes", 3, 2, 2, 1, [](Config& c) {
        c.options.model.n_embd = 48;
        c.options.model.n_head = 3;
        c.options.model.vocab_size = 48;
        c.options.model.batch_size = 4;
        c.nodes = 2;
        c.folds = false;
      }),
      // A capacity counted over the data ranks: drops follow the global
      // token order (dp rank 0's tokens first), so each replica drops other
      // assignments, and dp does not fold even without expert parallelism
      // (it did until session 34: every rank reported dp rank 0's imbalance).
      make("dp16_moe_capacity_over_the_data_ranks", 1, 1, 16, 1, [](Config& c) {
        c.options.model.n_expert = 6;
        c.options.model.top_k = 1;
        c.options.model.capacity_factor = 1.0;
        c.options.model.block_size = 8;
        c.options.model.batch_size = 16;
        c.nodes = 2;
        c.folds = false;
      }),
      make("dp8_moe", 1, 1, 8, 1, [](Config& c) {
        c.options.model.n_expert = 4;
        c.options.model.aux_coef = 0.01;
      }),
      // DeepSeek-V3's layout in small: dp 16 spans two nodes with 8 members
      // on each (ep 4 within a node, edp 4 over both), the stages on nodes of
      // their own. Aux-loss-free and dropless, each replica routes its own
      // tokens (parallel_plan.cc routes_globally): dp folds by place, 8 local
      // places x 2 stages. (Without ZeRO: the router bias's 4 elements per
      // block leave ZeRO-1's buckets uneven over 16 here.)
      make("pp2_dp16_ep4_moe_aux_free_four_nodes", 1, 2, 16, 2, [](Config& c) {
        c.options.model.n_expert = 4;
        c.options.model.aux_coef = 0;
        c.options.model.router_bias_rate = 0.01;
        c.options.model.batch_size = 32;  // one row per micro-batch: 32 tokens x top-2 = 16 rows per expert
        c.options.parallel.ep = 4;
        c.options.steps = 1;
        c.precision = Precision::kBf16;
        c.profile = "h100-nvlink";
        c.nodes = 4;
      }),
      // The ep group itself over two nodes (ep 16, as DeepSeek-V3's ep 64
      // over 8): the full dp fold meets an all-to-all that members at other
      // local places end apart; by place, the expert counts' all-to-all
      // (compute stream) shares the NIC with the pipeline's transfers and
      // the overlapped gradient reduction, which the replay books on the
      // shared ports: 8 local places x 2 stages.
      make("pp2_dp16_ep16_moe_aux_free_ep_over_two_nodes", 1, 2, 16, 2, [](Config& c) {
        aux_free_moe(c, 16, 16, 32, 4, 16);  // 32 tokens x top-2 = 4 rows per expert
      }),
      // DeepSeek-V3's dp group in small: dp 32 over four nodes (8 local
      // places x 4 node blocks), ep 16 over two of them: folded by place,
      // its dp and ep collectives replay one node's 8 members, each
      // standing for its twins on the other nodes (tuner.cc
      // replay_period: period 8), and the tuner's choice is shared by the
      // 8 threads. One stage, so no pipeline transfer on the NIC.
      make("dp32_ep16_moe_aux_free_dp_over_four_nodes", 1, 1, 32, 2, [](Config& c) {
        aux_free_moe(c, 16, 16, 64, 4, 8);  // 32 tokens x top-2 = 4 rows per expert
      }),
      // Qwen3-235B's recipe in small: the ep group over two nodes, Megatron's
      // combined 1F1B on the interleaved pipeline (each steady forward and
      // another micro-batch's backward as two programs, the exchanges on
      // the ep-comm stream) and the experts' weight gradients delayed; every
      // peer of a folded member runs the same interleaving.
      make("pp2_vpp2_dp16_ep16_moe_combined_1f1b_delayed_wgrad", 1, 2, 16, 4, [](Config& c) {
        aux_free_moe(c, 16, 16, 64, 4, 0);
        c.options.parallel.schedule = parallel::ScheduleKind::kInterleaved;
        c.options.parallel.vpp = 2;
        c.options.parallel.overlap_moe_comm = true;
        c.options.parallel.delay_wgrad = true;
      }),
  };
}

class FoldingChangesNothing : public ::testing::TestWithParam<Config> {};

TEST_P(FoldingChangesNothing, FoldedEqualsUnfolded) {
  const Config& c = GetParam();
  const TrainResult unfolded = run_on(c, true, /*fold=*/false);
  const TrainResult folded = run_on(c, true, /*fold=*/true);
  expect_same_devices(unfolded, folded);
  EXPECT_EQ(unfolded.running_devices, c.options.parallel.world());
  if (c.folds)
    EXPECT_LT(folded.running_devices, c.options.parallel.world()) << folded.folded;
  else
    EXPECT_EQ(folded.running_devices, c.options.parallel.world()) << folded.folded;
  if (c.running > 0) {
    EXPECT_EQ(folded.running_devices, c.running) << folded.folded;
  }
  std::printf("%s: %d of %d devices run (%s)\n", c.name.c_str(), folded.running_devices, c.options.parallel.world(),
              folded.folded.c_str());
}

// ZeRO-1/2 pad every bucket to a multiple of lcm(dp, 128), as Megatron does
// (buckets.h, padded_bucket), so dp 3 and dp 5, which divide none of this
// model's buckets, own equal chunks and fold: tp 2 x dp 3 and dp 5 (one
// node of 8) run on one thread with every figure of the unfolded run, bit
// for bit. ZeRO-3 (FSDP's units, not padded) still keeps dp unfolded when a
// unit does not divide: one thread per dp rank.
TEST(FoldingChangesNothing, ZeroFoldsDpWithPaddedBuckets) {
  for (int dp : {3, 5})
    for (int zero : {1, 2}) {
      const int tp = dp == 3 ? 2 : 1;
      Config c = make("tp" + std::to_string(tp) + "_dp" + std::to_string(dp) + "_zero" + std::to_string(zero), tp, 1,
                      dp, zero == 2 ? 2 : 1, [&](Config& c) {  // ZeRO-2: reduced every micro-batch
        c.options.parallel.zero = zero;
        c.options.parallel.bucket_mb = 0.05;  // several buckets, none a multiple of 3 or 5
        c.options.model.batch_size = 4 * dp;
      });
      SCOPED_TRACE(c.name);
      EXPECT_FALSE(uneven_chunks(c.options, ParallelPlan(c.options)));
      const TrainResult folded = run_on(c, true);
      EXPECT_EQ(folded.running_devices, 1) << folded.folded;
      const TrainResult unfolded = run_on(c, true, /*fold=*/false);
      EXPECT_EQ(unfolded.running_devices, tp * dp);
      expect_same_devices(unfolded, folded);
    }
  Config fsdp = make("tp2_dp3_zero3", 2, 1, 3, 1, [](Config& c) {
    c.options.parallel.zero = 3;
    c.options.model.batch_size = 12;
  });
  EXPECT_TRUE(uneven_chunks(fsdp.options, ParallelPlan(fsdp.options)));
  const TrainResult tp_only = run_on(fsdp, true);
  EXPECT_EQ(tp_only.running_devices, 3) << tp_only.folded;  // one per dp rank
  expect_same_devices(run_on(fsdp, true, /*fold=*/false), tp_only);
}

// A folded cp ring under host jitter (host order of its hand-offs changes,
// its figures do not): cp by place over two nodes (two
// threads hand each other the messages of the members they play) and cp x
// dp x pp (a thread per stage, each sending to itself), as unfolded.
TEST(FoldingChangesNothing, CpRingUnderHostJitter) {
  for (const Config& c : fold_configs()) {
    if (c.name != "cp4_tp4_sp_two_nodes_by_place" && c.name != "cp4_dp2_pp2_ring") continue;
    SCOPED_TRACE(c.name);
    testing::RandomSleeps naps(7);
    const TrainResult shaken = run_on(c, true, /*fold=*/true, &naps);
    EXPECT_GT(naps.naps(), 0);
    EXPECT_EQ(shaken.running_devices, c.running) << shaken.folded;
    expect_same_devices(run_on(c, true, /*fold=*/false), shaken);
  }
}

INSTANTIATE_TEST_SUITE_P(Phantom, FoldingChangesNothing, ::testing::ValuesIn(fold_configs()),
                         [](const auto& info) { return info.param.name; });

// Folding is for phantom runs: a real run with TrainOptions::fold runs every rank.
TEST(FoldPlan, RealRunsAreNeverFolded) {
  Config c = make("tp2_dp2", 2, 1, 2, 1, [](Config&) {});
  const TrainResult r = run_on(c, /*phantom=*/false, /*fold=*/true);
  EXPECT_EQ(r.running_devices, c.options.parallel.world());
  EXPECT_EQ(r.folded, "nothing folded");
}

}  // namespace
}  // namespace shardlab::train
