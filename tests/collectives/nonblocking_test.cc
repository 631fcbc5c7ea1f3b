// Non-blocking collectives run on the comm stream, after the event they are
// given, and overlap whatever the compute stream does meanwhile.
#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

TEST(NonBlockingTest, OverlapsComputeAndJoinsOnWait) {
  const int n = 4;
  Failures f;
  std::vector<Time> done(n), compute_end(n), joined(n);
  run_on(n, [&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    std::vector<float> grad = int_inputs(dev.rank(), 4096);
    // The gradient bucket is ready at compute time 0; a 1 ms "backward" follows.
    Work w = iall_reduce(dev, g, grad, grad, ReduceOp::kSum, {Algo::kRing, dev.compute().record()});
    dev.compute().run("backward", 1'000'000'000);  // 1 ms
    const auto r = static_cast<size_t>(dev.rank());
    done[r] = w.event().time;
    compute_end[r] = dev.compute().now();
    w.wait(dev.compute());
    joined[r] = dev.compute().now();
    check_range(f, "iall_reduce", grad.data(), grad.size(), [](size_t i) { return reference(ReduceOp::kSum, 4, i); });
  });
  f.expect_none();
  for (int r = 0; r < n; ++r) {
    EXPECT_LT(done[r], compute_end[r]) << "the all_reduce hides under the backward";
    EXPECT_EQ(joined[r], compute_end[r]);
  }
}

TEST(NonBlockingTest, StartsAfterItsEventAndQueuesOnTheCommStream) {
  const int n = 2;
  std::vector<Time> first(n), second(n), alone(n);
  run_on(n, [&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    std::vector<float> a(1000, 1.f), b(1000, 2.f);
    Work w0 = iall_reduce(dev, g, a, a);
    alone[static_cast<size_t>(dev.rank())] = w0.event().time;
    // 50 us: longer than one collective (~10 us with a100-nvlink's 8 us start),
    // so w1 really waits for the forward, not for w0.
    dev.compute().run("forward", 50'000'000);
    Work w1 = iall_reduce(dev, g, a, a, ReduceOp::kSum, {Algo::kAuto, dev.compute().record()});
    Work w2 = iall_reduce(dev, g, b, b, ReduceOp::kSum, {Algo::kAuto, Event{0}});  // ready long ago
    first[static_cast<size_t>(dev.rank())] = w1.event().time;
    second[static_cast<size_t>(dev.rank())] = w2.event().time;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(first[r], 50'000'000 + alone[r]);  // waited for the forward, then one collective
    EXPECT_EQ(second[r], first[r] + alone[r]);   // queued behind the first on the comm stream
  }
}

}  // namespace
}  // namespace shardlab::collectives::testing

namespace shardlab::collectives::testing {
namespace {

TEST(TensorTest, TensorsAndPhantomTensorsWorkAsBuffers) {
  Failures f;
  std::vector<Time> real_end(4), phantom_end(4);
  ClusterOptions opts;
  opts.world_size = 4;
  opts.precision = Precision::kBf16;
  Cluster cluster(load_profile("a100-nvlink"), opts);
  cluster.run([&](Device& dev) {
    ProcessGroup g = ProcessGroup::world(dev);
    Tensor grad = dev.alloc("grad", {64, 33}, MemKind::kGrad);
    for (int64_t i = 0; i < grad.numel(); ++i) grad.data()[i] = int_input(dev.rank(), static_cast<size_t>(i));
    const Time t0 = dev.comm().now();
    all_reduce(dev, g, grad, ReduceOp::kAvg, {Algo::kRing, std::nullopt});
    real_end[static_cast<size_t>(dev.rank())] = dev.comm().now() - t0;
    check_range(f, "tensor", grad.data(), static_cast<size_t>(grad.numel()),
                [](size_t i) { return reference(ReduceOp::kAvg, 4, i); });
    Tensor ghost = dev.alloc("ghost", {64, 33}, MemKind::kGrad, /*phantom=*/true);
    const Time t1 = dev.comm().now();
    all_reduce(dev, g, ghost, ReduceOp::kAvg, {Algo::kRing, std::nullopt});
    phantom_end[static_cast<size_t>(dev.rank())] = dev.comm().now() - t1;
  });
  f.expect_none();
  EXPECT_EQ(real_end, phantom_end);
}

}  // namespace
}  // namespace shardlab::collectives::testing
