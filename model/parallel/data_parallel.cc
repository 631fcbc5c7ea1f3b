#include "model/parallel/data_parallel.h"

#include <algorithm>

#include "model/parallel/local_model.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

namespace coll = collectives;

DataParallel::DataParallel(Device& dev, const coll::ProcessGroup& dp, std::span<float> grads,
                           const std::vector<Range>& ready_order, const DataParallelOptions& options)
    : dev_(dev), dp_(dp), grads_(grads), options_(options), elem_(element_size(dev.precision())) {
  SHARDLAB_CHECK(options_.zero >= 0 && options_.zero <= 2);
  plan(ready_order);
}

void DataParallel::plan(const std::vector<Range>& ready_order) {
  // Consecutive ranges fill a bucket until it holds bucket_bytes; a range not
  // adjacent to the open bucket closes it.
  Range open{0, 0};
  for (const Range& r : ready_order) {
    if (r.size <= 0) continue;
    const bool adjacent = open.size > 0 && (r.begin + r.size == open.begin || open.begin + open.size == r.begin);
    if (open.size > 0 && !adjacent) {
      layout_.push_back(open);
      open = {0, 0};
    }
    open = open.size == 0 ? r : Range{std::min(open.begin, r.begin), open.size + r.size};
    if (uint64_t(open.size) * elem_ >= options_.bucket_bytes) {
      layout_.push_back(open);
      open = {0, 0};
    }
  }
  if (open.size > 0) layout_.push_back(open);
  int64_t covered = 0;
  for (const Range& b : layout_) covered += b.size;
  SHARDLAB_CHECK(covered == static_cast<int64_t>(grads_.size()), "ready order must cover every gradient once");
  ready_.assign(layout_.size(), 0);
  launched_.assign(layout_.size(), false);
  for (const Range& b : layout_) {
    if (options_.zero == 0) {
      owned_.push_back(b);
    } else {
      const auto c = coll::chunk_range(static_cast<size_t>(b.size), dp_.size(), dp_.rank());
      if (c.size > 0) owned_.push_back({b.begin + static_cast<int64_t>(c.begin), static_cast<int64_t>(c.size)});
    }
  }
  std::sort(owned_.begin(), owned_.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (const Range& r : owned_) owned_elements_ += r.size;
}

void DataParallel::begin_step() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
  works_.clear();
}

void DataParallel::grads_ready(int64_t offset, int64_t count) {
  for (size_t i = 0; i < layout_.size(); ++i) {
    const Range& b = layout_[i];
    const int64_t lo = std::max(offset, b.begin), hi = std::min(offset + count, b.begin + b.size);
    if (hi <= lo) continue;
    ready_[i] += hi - lo;
    if (options_.overlap && ready_[i] == b.size) launch(i);
  }
}

void DataParallel::launch(size_t i) {
  if (launched_[i]) return;
  launched_[i] = true;
  if (dp_.size() == 1) return;
  const Range& r = layout_[i];
  float* p = grads_.data() + r.begin;
  const size_t n = static_cast<size_t>(r.size);
  coll::CollOptions opt;
  opt.after = dev_.compute().record();  // the bucket exists once backward produced it
  if (sharded_grads()) {
    const auto chunk = coll::chunk_range(n, dp_.size(), dp_.rank());
    works_.push_back(coll::ireduce_scatter(dev_, dp_, coll::ConstBuffer(p, n),
                                           coll::Buffer(p + chunk.begin, chunk.size),
                                           coll::ReduceOp::kAvg, opt));
  } else {
    works_.push_back(coll::iall_reduce(dev_, dp_, coll::ConstBuffer(p, n), coll::Buffer(p, n),
                                       coll::ReduceOp::kAvg, opt));
  }
}

void DataParallel::finish_grads() {
  for (size_t i = 0; i < layout_.size(); ++i) launch(i);
  for (const auto& w : works_) w.wait(dev_.compute());
}

void DataParallel::gather_params(std::span<float> params) {
  if (options_.zero == 0 || dp_.size() == 1) return;
  std::vector<coll::Work> works;
  for (const Range& b : layout_) {
    float* p = params.data() + b.begin;
    const size_t n = static_cast<size_t>(b.size);
    const auto c = coll::chunk_range(n, dp_.size(), dp_.rank());
    coll::CollOptions opt;
    opt.after = dev_.compute().record();
    works.push_back(coll::iall_gather(dev_, dp_, coll::ConstBuffer(p + c.begin, c.size), coll::Buffer(p, n), opt));
  }
  for (const auto& w : works) w.wait(dev_.compute());
}

uint64_t DataParallel::largest_bucket_bytes() const {
  int64_t m = 0;
  for (const Range& b : layout_) m = std::max(m, b.size);
  return uint64_t(m) * elem_;
}

std::vector<DataParallel::Range> backward_ready_order(const std::vector<ShardSpec>& shards) {
  // ln_f first, then blocks from last to first, then the embeddings; inside a
  // group from the highest offset down, so consecutive tensors are adjacent.
  int max_layer = -1;
  for (const auto& s : shards) max_layer = std::max(max_layer, s.layer);
  auto key = [&](const ShardSpec& s) {
    if (s.layer >= 0) return s.layer;
    return s.name.rfind("transformer.ln_f.", 0) == 0 ? max_layer + 1 : -1;
  };
  std::vector<const ShardSpec*> order;
  for (const auto& s : shards) order.push_back(&s);
  std::sort(order.begin(), order.end(), [&](const ShardSpec* a, const ShardSpec* b) {
    return key(*a) != key(*b) ? key(*a) > key(*b) : a->offset > b->offset;
  });
  std::vector<DataParallel::Range> out;
  for (const ShardSpec* s : order) out.push_back({s->offset, s->numel});
  return out;
}

}  // namespace shardlab::parallel
