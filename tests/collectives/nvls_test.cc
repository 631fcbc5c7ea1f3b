// NVLink SHARP's all_reduce (Algo::kNvls, collectives/nvls.cc): its time by
// hand, its bus bandwidth against NCCL's published DGX H100 figures, exact
// sums on every member, and where it does not apply.
#include "collectives/detail.h"
#include "collectives/tuner.h"

#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

Time run_nvls(const HardwareProfile& p, int n, size_t count, Algo algo) {
  const CollOptions opt{algo, std::nullopt};
  return run_on(
             n, [&](Device& dev) { all_reduce(dev, ProcessGroup::world(dev), Buffer::phantom(count), ReduceOp::kSum, opt); },
             p)
      .makespan();
}

// 4 MiB of fp32 (2^20 elements) on the 8 GPUs of one DGX H100, by hand:
//   x = ceil(2^20 x 9 / (2 x 8 x 7)) = 84261 elements = 337044 B a message,
//       2 x 7 of them each way: 9/8 of the buffer, as NVLS moves it;
//   on NVLink4 (32 B of header per 128 B SM packet): 337044 + 2634 x 32 =
//       421332 B at 0.85 x 450 GB/s = 382.5 GB/s: w = 1101521.57 -> 1101522 ps;
//   start 4 us launch + 8.4 us (Simple's base), a = 3.4 us (Simple's NVLink hop):
//   T = 12.4 us + 2 (3.4 us + 7 w) = 34621308 ps.
TEST(NvlsTest, AllReduceMovesNinthsEighthsOfTheBufferAtTheSwitchsRate) {
  const HardwareProfile p = load_profile("h100-nvlink");
  EXPECT_EQ(detail::nvls_charged(size_t{1} << 20, 8), 84261u);
  EXPECT_EQ(detail::nvls_rate(p), 382'500'000'000u);
  const Time want = 12'400'000 + 2 * (3'400'000 + 7 * 1'101'522);
  const Time t = run_nvls(p, 8, size_t{1} << 20, Algo::kNvls);
  EXPECT_EQ(t, want);
  CollShape s{OpKind::kAllReduce, size_t{1} << 20, 4, 0};
  EXPECT_EQ(predict_time(p, first_ranks(8), s, Algo::kNvls), t);
  fmt::print("nvls all_reduce 4 MiB on 8 H100: {} ps (by hand {} ps)\n", t, want);
}

// NCCL's figures on one DGX H100 (8 H100 SXM, NVLink4 through NVSwitch),
// all_reduce busbw with NVLS: NVIDIA/nccl#1455 (NCCL_ALGO=NVLS, 2-4 GiB):
// 420, 440, 460 and 480 GB/s on 5, 6, 7 and 8 GPUs ("about 365-370 GBps"
// with RING); nccl-tests#212 (S. Jeaugey): "On 8 GPUs, you should reach a
// peak busBw of ~480GB/s (algbw ~275GB/s)", against ~370 for the ring
// (and 365-370 measured with NVLS forced on 4, #1455). Tolerance 5% (the
// issue's goal is 10%); auto picks nvls there.
TEST(NvlsTest, BusBandwidthMatchesNcclOnDgxH100) {
  const HardwareProfile p = load_profile("h100-nvlink");
  const size_t count = size_t{1} << 29;  // 2 GiB of fp32
  struct Row {
    int n;
    double published;
    double readme;  // the README's table ("NVLink SHARP"), to its 0.1 GB/s
  };
  for (const Row& r : {Row{4, 367.5, 366.4}, Row{5, 420, 407.1}, Row{6, 440, 436.1}, Row{7, 460, 457.9},
                       Row{8, 480, 474.8}}) {
    CollShape s{OpKind::kAllReduce, count, 4, 0};
    const Choice c = select(p, first_ranks(r.n), s);
    EXPECT_EQ(c.algo, Algo::kNvls) << r.n;
    const double algbw = double(count) * 4 / to_seconds(c.time) / 1e9;
    const double busbw = algbw * 2 * (r.n - 1) / r.n;
    EXPECT_NEAR(busbw, r.published, 0.05 * r.published) << r.n << " GPUs";
    EXPECT_NEAR(busbw, r.readme, 0.05) << r.n << " GPUs: the README's figure";
    fmt::print("nvls all_reduce 2 GiB on {} H100: busbw {:.1f} GB/s, NVIDIA/nccl#1455 {:.0f} ({:+.1f}%)\n", r.n,
               busbw, r.published, 100 * (busbw / r.published - 1));
  }
  // 1 GiB on 8: the busbw table's row (README "Inside a node").
  const Time t = run_nvls(p, 8, size_t{1} << 28, Algo::kAuto);
  const double busbw = double(size_t{1} << 30) / to_seconds(t) / 1e9 * 7 / 4;
  EXPECT_NEAR(busbw, 480, 48);
  EXPECT_NEAR(busbw, 473.7, 0.05);  // the README's busbw table (and h200-nvlink's, the same links)
  fmt::print("auto all_reduce 1 GiB on 8 H100: busbw {:.1f} GB/s against ~480 (nccl-tests#212)\n", busbw);
  // The ring keeps NCCL's ~370 (it does not use the switch's reduction).
  const Time ring = run_nvls(p, 8, size_t{1} << 28, Algo::kRing);
  EXPECT_GT(ring, t);
  // Where auto starts to pick it on 8 H100 in fp32 (the README: "from 1 MiB"):
  // 128 KiB stays with the others, 1 MiB is nvls.
  EXPECT_NE(select(p, first_ranks(8), CollShape{OpKind::kAllReduce, 32768, 4, 0}).algo, Algo::kNvls);
  EXPECT_EQ(select(p, first_ranks(8), CollShape{OpKind::kAllReduce, 262144, 4, 0}).algo, Algo::kNvls);
  // On 2 GPUs auto keeps direct; forced, nvls gives the README's 203.6 GB/s at 2 GiB.
  const CollShape two{OpKind::kAllReduce, count, 4, 0};
  EXPECT_NE(select(p, first_ranks(2), two).algo, Algo::kNvls);
  EXPECT_NEAR(double(count) * 4 / to_seconds(predict_time(p, first_ranks(2), two, Algo::kNvls)) / 1e9, 203.6, 0.05);
  // 8 B200 (NVLink5, Blackwell's nvlsEfficiency 0.74): "Ours is 830+" (NVIDIA/nccl#1807, NCCL 2.27.1).
  const Time b200 = run_nvls(load_profile("b200-nvlink"), 8, size_t{1} << 28, Algo::kAuto);
  const double b200_busbw = double(size_t{1} << 30) / to_seconds(b200) / 1e9 * 7 / 4;
  EXPECT_NEAR(b200_busbw, 830, 83);
  EXPECT_NEAR(b200_busbw, 821.8, 0.05);  // the README's
  fmt::print("auto all_reduce 1 GiB on 8 B200: busbw {:.1f} GB/s against 830+ (NVIDIA/nccl#1807)\n", b200_busbw);
}

// Every member ends with the serial reference, bit for bit (small-integer
// inputs: exact in any order), for sum, avg and max, counts the group does
// not divide (1 element on 8 members, 7, 4099) and in place.
TEST(NvlsTest, EveryMemberEndsWithTheExactReduction) {
  const HardwareProfile p = load_profile("h100-nvlink");
  for (int n : {2, 5, 8})
    for (size_t count : {size_t{1}, size_t{7}, size_t{4099}})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
        for (bool in_place : {false, true}) {
          Failures f;
          const CollOptions opt{Algo::kNvls, std::nullopt};
          run_on(
              n,
              [&](Device& dev) {
                std::vector<float> in = int_inputs(dev.rank(), count), out(count, -99.f);
                const ProcessGroup g = ProcessGroup::world(dev);
                if (in_place) {
                  all_reduce(dev, g, Buffer{in.data(), count}, op, opt);
                  out = in;
                } else {
                  all_reduce(dev, g, ConstBuffer{in.data(), count}, Buffer{out.data(), count}, op, opt);
                }
                check_range(f, fmt::format("n {} count {} op {} in place {} device {}", n, count, reduce_op_name(op),
                                           in_place, dev.rank()),
                            out.data(), count, [&](size_t i) { return reference(op, n, i); });
              },
              p);
          f.expect_none();
        }
}

// Where no NVSwitch reduces: an A100 node (NVSwitch gen2 has no SHARP), a
// group across nodes (NVLS is inside one NVLink domain here), another
// collective, another protocol. Each a ConfigError naming nvls.
TEST(NvlsTest, RefusedWhereTheSwitchCannotReduce) {
  const HardwareProfile h100 = nodes_of("h100-nvlink", 2), a100 = load_profile("a100-nvlink");
  const CollShape ar{OpKind::kAllReduce, 1024, 4, 0};
  EXPECT_TRUE(nvls_applies(h100, first_ranks(8), ar));
  EXPECT_FALSE(nvls_applies(h100, first_ranks(1), ar));
  EXPECT_FALSE(nvls_applies(a100, first_ranks(8), ar));
  EXPECT_FALSE(nvls_applies(h100, first_ranks(16), ar));
  EXPECT_THROW(predict_time(a100, first_ranks(8), ar, Algo::kNvls), ConfigError);
  EXPECT_THROW(predict_time(h100, first_ranks(16), ar, Algo::kNvls), ConfigError);
  const CollShape ag{OpKind::kAllGather, 1024, 4, 0};
  EXPECT_THROW(predict_time(h100, first_ranks(8), ag, Algo::kNvls), ConfigError);
  // auto never weighs it where it does not apply: A100 and two nodes pick as before.
  EXPECT_NE(select(a100, first_ranks(8), CollShape{OpKind::kAllReduce, size_t{1} << 28, 4, 0}).algo, Algo::kNvls);
  EXPECT_NE(select(h100, first_ranks(16), CollShape{OpKind::kAllReduce, size_t{1} << 28, 4, 0}).algo, Algo::kNvls);
  // Only Simple: LL is refused on the device (api.cc resolve).
  CollOptions ll{Algo::kNvls, std::nullopt};
  ll.proto = Proto::kLL;
  EXPECT_THROW(run_on(
                   2, [&](Device& dev) { all_reduce(dev, ProcessGroup::world(dev), Buffer::phantom(64), ReduceOp::kSum, ll); },
                   load_profile("h100-nvlink")),
               std::exception);
}

}  // namespace
}  // namespace shardlab::collectives::testing
