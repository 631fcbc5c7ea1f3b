// WeightGrads: a deferred weight gradient equals the immediate one bit for
// bit (whatever the alignment of its operands), accumulates in recording
// order, charges its stash while it lives and reports each block once.
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "model/buffer.h"
#include "model/kernels.h"
#include "model/parallel/weight_grad.h"
#include "model/sink.h"
#include "support/random.h"

namespace shardlab::parallel {
namespace {

struct CountingSink final : model::OpSink {
  int64_t live = 0, peak = 0;
  std::vector<std::string> ops;
  void op(const char* name, const OpCost&) override { ops.push_back(name); }
  void saved(int64_t n) override { peak = std::max(peak, live += n); }
  void freed(int64_t n) override { live -= n; }
};

model::Buffer<float> random_buffer(size_t n, uint64_t seed) { return testing::normal_values<model::Buffer<float>>(n, seed); }

TEST(WeightGrads, DeferredEqualsImmediateBitForBit) {
  const int64_t N = 37;
  const int C = 24, OC = 40;
  // Operands at odd offsets inside their buffers: the copies must keep the phase.
  const auto dout = random_buffer(N * OC + 5, 1), inp = random_buffer(N * C + 3, 2);
  for (int64_t shift : {0, 1, 3}) {
    model::Buffer<float> dw_now(OC * C, 0.5f), db_now(OC, 0.25f), dw_later = dw_now, db_later = db_now;
    CountingSink sink;
    const model::Exec ex = model::Exec::with(&sink);
    WeightGrads now, later;
    later.set_deferred(true);
    for (int rep = 0; rep < 2; ++rep) {  // accumulate twice, as two micro-batches
      now.linear("w", dw_now.data(), db_now.data(), true, dout.data() + shift + rep, inp.data() + shift, N, C, OC, ex);
      later.linear("w", dw_later.data(), db_later.data(), true, dout.data() + shift + rep, inp.data() + shift, N, C, OC, ex);
    }
    later.end_block(7);
    // During B only the output gradients are new memory; the inputs are the
    // activations B still holds, charged to the stash once B frees those.
    EXPECT_EQ(sink.live, 2 * N * OC);
    later.charge_inputs(ex);
    EXPECT_EQ(sink.live, 2 * N * (OC + C));  // the stash: dout and inp of both records
    EXPECT_EQ(later.stash_elements(), 2 * N * (OC + C));
    std::vector<int> blocks;
    later.flush(ex, [&](int layer) { blocks.push_back(layer); });
    EXPECT_EQ(sink.live, 0);
    EXPECT_EQ(blocks, std::vector<int>{7});
    EXPECT_TRUE(later.empty());
    int64_t differ = 0;
    for (size_t i = 0; i < dw_now.size(); ++i) differ += dw_now[i] != dw_later[i];
    for (size_t i = 0; i < db_now.size(); ++i) differ += db_now[i] != db_later[i];
    std::printf("shift %lld: %lld of %zu elements differ between immediate and deferred (must be 0)\n",
                (long long)shift, (long long)differ, dw_now.size() + db_now.size());
    EXPECT_EQ(differ, 0);
    EXPECT_EQ(sink.ops.size(), 4u);  // two immediate, two at flush
  }
}

TEST(WeightGrads, FlushReportsEachBlockAfterItsLastGradient) {
  CountingSink sink;
  const model::Exec ex = model::Exec::with(&sink);
  WeightGrads w;
  w.set_deferred(true);
  model::Buffer<float> dw(4, 0), x(4, 1), dy(4, 1);
  auto record = [&] { w.linear("w", dw.data(), nullptr, false, dy.data(), x.data(), 2, 2, 2, ex); };
  record();
  w.end_block(3);
  record(), record();  // block 2 has two linears
  w.end_block(2);
  record();
  w.end_block(1);
  EXPECT_EQ(w.stash_elements(), 4 * 8);
  std::vector<int> seen;
  w.flush(ex, [&](int layer) { seen.push_back(layer); });
  EXPECT_EQ(seen, (std::vector<int>{3, 2, 1}));
  // dw = 4 records of dyᵀx with all-ones (2x2) operands: 2 each, 8 in all.
  for (float v : dw) EXPECT_EQ(v, 8.0f);
}

}  // namespace
}  // namespace shardlab::parallel
