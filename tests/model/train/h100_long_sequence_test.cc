// NeMo's long-sequence table (NeMo 24.03.01, DGX-H100, FP8): the held-out
// rows whose error depends on the fused attention kernel most, pinned in
// README like h100_calibration_test.cc's tables and counted in its held-out
// summary.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "calibration_tables.h"
#include "model/train/calibration.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

using readme::expect_readme_table;
using readme::kNemoLongSeqHeader;

// Held out of the fit: NeMo's long-sequence table (NeMo 24.03.01, DGX-H100,
// FP8; model/train/calibration_tables.cc nemo2403_h100_fp8_long_sequence):
// Llama 2 7B at 4K to 1M tokens a sequence on as many GPUs as it has K
// tokens, CP from 32K, each run with the launcher's FlashAttention-2. The
// held-out goal, every row within 10% and the mean within 5%, asserted
// (mean 2.2%, max +4.7% at 1M when added in session 32; with cuDNN's
// rates instead the rows are +7.0% at 4K to +63.8% at 1M, mean 35.9%: the
// test below checks that the kernel is what separates them).
TEST(H100Calibration, HeldOutNeMoLongSequenceRowsAreReadmes) {
  const std::vector<PublishedRun>& rows = nemo2403_h100_fp8_long_sequence();
  ASSERT_EQ(rows.size(), 9u);
  const int cp[] = {1, 1, 1, 2, 2, 4, 8, 16, 32};
  for (size_t i = 0; i < rows.size(); ++i) {
    const TrainOptions o = published_run_options(rows[i]);
    EXPECT_EQ(o.parallel.cp, cp[i]) << rows[i].name;
    EXPECT_EQ(o.parallel.tp * o.parallel.pp * o.parallel.dp * o.parallel.cp, rows[i].gpus) << rows[i].name;
    EXPECT_EQ(rows[i].gpus * 1024, o.model.block_size) << rows[i].name;  // K tokens = GPUs
    EXPECT_EQ(int64_t{o.model.batch_size} * o.model.block_size, int64_t{4} << 20) << rows[i].name;
    EXPECT_STREQ(rows[i].attention_kernel, "fa2") << rows[i].name;
  }
  expect_readme_table(kNemoLongSeqHeader, rows, "NeMo 24.03.01, DGX-H100, FP8, Llama 2 7B, 9 sequence lengths (held out): ",
                      0.10, 0.05);
}

// The kernel is the mechanism: the 1M row (attention ~97% of its FLOPs) at
// FlashAttention-2's rates against cuDNN's, everything else alike. cuDNN's
// forward is 1.61x FA2's at 16k causal (539 / 335) and its backward 1.60x
// (516 / 322), so the step must shrink by most of that ratio.
TEST(H100Calibration, LongSequenceRowTurnsOnTheAttentionKernel) {
  PublishedRun row = nemo2403_h100_fp8_long_sequence().back();
  const HardwareProfile h100 = load_profile("h100-nvlink");
  const double fa2 = predict(row, h100).step_s;
  row.attention_kernel = "cudnn";
  const double cudnn = predict(row, h100).step_s;
  std::printf("1M tokens: step %.3f s with fa2, %.3f s with cudnn (ratio %.3f)\n", fa2, cudnn, fa2 / cudnn);
  EXPECT_GT(fa2 / cudnn, 1.45);
  EXPECT_LT(fa2 / cudnn, 1.61);
}

}  // namespace
}  // namespace shardlab::train
