#include <new>
#include <stdexcept>

#include <gtest/gtest.h>

#include "runtime/arena.h"
#include "runtime/errors.h"
#include "runtime/tensor.h"

namespace shardlab {
namespace {

TEST(Arena, TracksCurrentAndPeakByKind) {
  Arena a(3, 1000);
  a.allocate(400, MemKind::kParam, "w");
  a.allocate(300, MemKind::kActivation, "act");
  EXPECT_EQ(a.used(), 700u);
  a.release(300, MemKind::kActivation);
  a.allocate(100, MemKind::kActivation, "act2");
  EXPECT_EQ(a.used(), 500u);
  EXPECT_EQ(a.peak(), 700u);
  EXPECT_EQ(a.peak(MemKind::kActivation), 300u);
  EXPECT_EQ(a.used(MemKind::kParam), 400u);
  a.reset_peak();
  EXPECT_EQ(a.peak(), 500u);
}

TEST(Arena, OutOfMemoryNamesDeviceTensorAndSizes) {
  Arena a(5, 64 << 20);
  a.allocate(60 << 20, MemKind::kParam, "big");
  try {
    a.allocate(8 << 20, MemKind::kActivation, "transformer.h.0.attn.c_attn.weight");
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("device 5"), std::string::npos) << m;
    EXPECT_NE(m.find("transformer.h.0.attn.c_attn.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("8388608 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("4194304 bytes free"), std::string::npos) << m;
  }
  EXPECT_EQ(a.used(), 60u << 20);  // a failed allocation changes nothing
}

TEST(Tensor, ChargesModeledBytesAndFreesOnDestruction) {
  Arena a(0, 1 << 20);
  {
    Tensor t(a, "x", {4, 8}, MemKind::kActivation, Precision::kBf16);
    EXPECT_EQ(t.modeled_bytes(), 64u);  // 32 elements x 2 bytes
    EXPECT_EQ(a.used(), 64u);
    ASSERT_NE(t.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
    for (float v : t.span()) EXPECT_EQ(v, 0.0f);
    Tensor moved = std::move(t);
    EXPECT_FALSE(t.defined());
    EXPECT_EQ(a.used(), 64u);
  }
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.peak(), 64u);
}

TEST(Tensor, PhantomHasShapeAndCostButNoStorage) {
  Arena a(0, 1ull << 40);
  Tensor t(a, "huge", {12288, 49152}, MemKind::kParam, Precision::kBf16, /*phantom=*/true);
  EXPECT_TRUE(t.phantom());
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(t.span().size(), 0u);
  EXPECT_EQ(a.used(), 12288ull * 49152 * 2);
  EXPECT_EQ(shape_string(t.shape()), "[12288, 49152]");
}

// A shape is the caller's: a negative dimension or a count past 2^63 is an
// exception (the run reports it), never an abort or a wrapped count.
TEST(Tensor, BadShapesThrow) {
  try {
    (void)shape_numel({4, -2});
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "shape [4, -2]: negative dimension");
  }
  EXPECT_THROW((void)shape_numel({int64_t{1} << 32, int64_t{1} << 32}), std::bad_alloc);
  EXPECT_EQ(shape_numel({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_EQ(shape_numel({0, int64_t{1} << 62, 1 << 20}), 0);
  Arena a(0, 1ull << 40);
  EXPECT_THROW(Tensor(a, "bad", {3, -1}, MemKind::kParam, Precision::kFp32), std::invalid_argument);
  EXPECT_EQ(a.used(), 0u);
}

}  // namespace
}  // namespace shardlab
