#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using testing::kUs;
using testing::simple_profile;

std::span<const std::byte> no_bytes() { return {}; }

TEST(Links, OneMessageTakesLatencyPlusSizeOverBandwidth) {
  // 1 MB intra: 1 us + 1e6 / 100e9 s = 11 us. Inter (device 0 -> 4): 5 us + 100 us.
  Time intra = 0, inter = 0;
  Cluster c(simple_profile(), {.world_size = 8});
  c.run([&](Device& d) {
    if (d.rank() == 0) {
      d.isend(d.comm(), 1, 7, no_bytes(), 1'000'000);
      d.isend(d.comm(), 4, 7, no_bytes(), 1'000'000);
    } else if (d.rank() == 1) {
      d.recv(d.comm(), 0, 7);
      intra = d.comm().now();
    } else if (d.rank() == 4) {
      d.recv(d.comm(), 0, 7);
      inter = d.comm().now();
    }
  });
  EXPECT_EQ(intra, 11 * kUs);
  EXPECT_EQ(inter, 105 * kUs);  // different port class: no queueing behind the intra send
}

TEST(Links, BackToBackSendsQueueOnTheEgressPort) {
  std::vector<Time> arrivals(4);
  Time sender_done = 0;
  Cluster c(simple_profile(), {.world_size = 4});
  c.run([&](Device& d) {
    if (d.rank() == 0) {
      SendHandle last;
      for (int dst : {1, 2, 3, 1}) last = d.isend(d.comm(), dst, 1, no_bytes(), 1'000'000);
      EXPECT_EQ(d.comm().now(), 0);  // isend does not move the stream
      d.wait(d.comm(), last);
      sender_done = d.comm().now();
    } else {
      d.recv(d.comm(), 0, 1);
      arrivals[d.rank()] = d.comm().now();
      if (d.rank() == 1) {
        d.recv(d.comm(), 0, 1);
        arrivals[0] = d.comm().now();
      }
    }
  });
  // Each message holds the egress port 10 us: arrivals at 11, 21, 31, 41 us.
  EXPECT_EQ(arrivals[1], 11 * kUs);
  EXPECT_EQ(arrivals[2], 21 * kUs);
  EXPECT_EQ(arrivals[3], 31 * kUs);
  EXPECT_EQ(arrivals[0], 41 * kUs);
  EXPECT_EQ(sender_done, 40 * kUs);  // the last byte left at 40 us
}

TEST(Links, TwoSendersIntoOneReceiverQueueOnItsIngressPort) {
  std::vector<Time> arrivals;
  Cluster c(simple_profile(), {.world_size = 8});
  c.run([&](Device& d) {
    if (d.rank() == 1 || d.rank() == 2) d.isend(d.comm(), 0, 3, no_bytes(), 1'000'000);
    if (d.rank() == 5) d.isend(d.comm(), 0, 3, no_bytes(), 1'000'000);  // inter-node
    if (d.rank() == 0) {
      for (int src : {2, 1, 5}) {
        d.recv(d.comm(), src, 3);
        arrivals.push_back(d.comm().now());
      }
    }
  });
  // Ingress is booked in the receiver's program order: 2 first (11 us), then 1
  // (21 us); the inter-node message uses the other port: 5 + 100 = 105 us.
  EXPECT_EQ(arrivals, (std::vector<Time>{11 * kUs, 21 * kUs, 105 * kUs}));
}

TEST(Links, ComputeOverlapsATransferOnTheCommStream) {
  Time end = 0, compute_after_wait = 0;
  Cluster c(simple_profile(), {.world_size = 2});
  c.run([&](Device& d) {
    if (d.rank() == 1) {
      d.isend(d.comm(), 0, 1, no_bytes(), 4'000'000);  // 1 + 40 = 41 us
      return;
    }
    d.compute().run("kernel", 50 * kUs);
    d.recv(d.comm(), 1, 1);
    end = d.now();
    // A kernel that needs the data waits for the comm stream.
    d.compute().wait(d.comm().record());
    compute_after_wait = d.compute().now();
  });
  EXPECT_EQ(end, 50 * kUs);  // max(50, 41), not 91
  EXPECT_EQ(compute_after_wait, 50 * kUs);
}

TEST(Links, ComputeOpsFollowTheCostModel) {
  auto p = simple_profile();
  p.device.launch_overhead_us = 3;
  Time t = 0;
  Cluster c(p, {.world_size = 1});
  c.run([&](Device& d) { t = d.run(d.compute(), "matmul", {1e9, 0}); });
  EXPECT_EQ(t, 3 * kUs + 100 * kUs);  // 1 GFLOP at 10 TFLOP/s
}

TEST(Links, TensorPayloadIsCopiedAtSendTime) {
  std::vector<float> got;
  Cluster c(simple_profile(), {.world_size = 2});
  c.run([&](Device& d) {
    Tensor t = d.alloc("x", {5}, MemKind::kComm);
    if (d.rank() == 0) {
      for (int i = 0; i < 5; ++i) t.data()[i] = 1.5f * i;
      d.isend(d.comm(), 1, 9, t);
      t.data()[0] = 99;  // eager protocol: the message already holds its copy
    } else {
      d.recv(d.comm(), 0, 9, t);
      got.assign(t.data(), t.data() + 5);
      // 5 fp32 elements = 20 bytes: 1 us + 20 / 1e11 s (rounded up to 200 ps).
      EXPECT_EQ(d.comm().now(), 1 * kUs + 200);
    }
  });
  EXPECT_EQ(got, (std::vector<float>{0, 1.5f, 3, 4.5f, 6}));
}

TEST(Links, FifoPerSourceAndTag) {
  std::vector<int> order;
  Cluster c(simple_profile(), {.world_size = 2});
  c.run([&](Device& d) {
    if (d.rank() == 0) {
      for (int i = 0; i < 4; ++i) {
        int v = i;
        d.isend(d.comm(), 1, i % 2, std::as_bytes(std::span<const int>(&v, 1)), 4);
      }
    } else {
      for (Tag tag : {1, 1, 0, 0}) {
        Message m = d.recv(d.comm(), 0, tag);
        int v;
        std::memcpy(&v, m.bytes().data(), 4);
        order.push_back(v);
      }
    }
  });
  EXPECT_EQ(order, (std::vector<int>{1, 3, 0, 2}));
}

TEST(Links, RecvIntoTensorOfWrongSizeFailsClearly) {
  Cluster c(simple_profile(), {.world_size = 2});
  try {
    c.run([&](Device& d) {
      Tensor t = d.alloc(d.rank() == 0 ? "src" : "dst", {d.rank() == 0 ? 4 : 6}, MemKind::kComm);
      if (d.rank() == 0) d.isend(d.comm(), 1, 1, t);
      else d.recv(d.comm(), 0, 1, t);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_NE(std::string(e.what()).find("recv into 'dst'"), std::string::npos) << e.what();
  }
}

TEST(Cluster, WorldLargerThanTheProfileIsAConfigError) {
  EXPECT_THROW(Cluster(simple_profile(1, 4), {.world_size = 5}), ConfigError);
}

}  // namespace
}  // namespace shardlab

namespace shardlab {
namespace {

TEST(Links, NonBlockingReceiveCompletesAtWaitAndOverlapsCompute) {
  Time after_wait = 0, compute_end = 0;
  Cluster c(testing::simple_profile(), {.world_size = 2});
  c.run([&](Device& d) {
    if (d.rank() == 1) {
      d.isend(d.comm(), 0, 4, {}, 2'000'000);  // 1 + 20 = 21 us
      return;
    }
    RecvHandle h = d.irecv(d.comm(), 1, 4);
    compute_end = d.compute().run("kernel", 30 * testing::kUs);  // overlaps the transfer
    d.wait(d.comm(), h);
    after_wait = d.comm().now();
  });
  EXPECT_EQ(after_wait, 21 * testing::kUs);
  EXPECT_EQ(compute_end, 30 * testing::kUs);
}

}  // namespace
}  // namespace shardlab
