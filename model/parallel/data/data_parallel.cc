#include "model/parallel/data/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "model/buffer.h"
#include "model/parallel/local_model.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

namespace coll = collectives;

DataParallel::DataParallel(Device& dev, const coll::ProcessGroup& dp, std::span<float> grads,
                           const std::vector<Range>& ready_order, const DataParallelOptions& options,
                           const ExpertGrads& experts)
    : DataParallel(dev, dp, grads, plan_buckets(ready_order, experts.ranges, options.bucket_bytes, kGradElemBytes, options.alone),
                   options, experts) {
  SHARDLAB_CHECK(options_.zero <= 2, "ZeRO-3 buckets are planned by fsdp_bucket_plan");
}

DataParallel::DataParallel(Device& dev, const coll::ProcessGroup& dp, std::span<float> grads,
                           BucketPlan plan, const DataParallelOptions& options, const ExpertGrads& experts)
    : dev_(dev), dp_(dp), grads_(grads), options_(options), expert_ranges_(experts.ranges) {
  SHARDLAB_CHECK(options_.zero >= 0 && options_.zero <= 3);
  SHARDLAB_CHECK(expert_ranges_.empty() || experts.edp != nullptr, "expert ranges need the edp group");
  if (!expert_ranges_.empty()) {
    // ep = 1 makes edp the dp group itself: share its collective sequence counter.
    edp_ = experts.edp->members() == dp_.members() ? dp_ : *experts.edp;
    SHARDLAB_CHECK(dp_.size() % edp_->size() == 0, "edp must divide dp");
  }
  std::sort(expert_ranges_.begin(), expert_ranges_.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  int64_t covered = 0;
  for (const Range& b : plan.buckets) covered += b.size;
  SHARDLAB_CHECK(covered == static_cast<int64_t>(grads_.size()), "ready order must cover every gradient once");
  const coll::ProcessGroup& edp = edp_ ? *edp_ : dp_;
  owned_ = owned_ranges(plan, options_.zero, dp_.size(), dp_.rank(), edp.size(), edp.rank());
  owned_elements_ = parallel::owned_elements(plan, options_.zero, dp_.size(), dp_.rank(), edp.size(), edp.rank());
  for (size_t i = 0; i < plan.buckets.size(); ++i)
    padded_.push_back(padded_bucket(plan.buckets[i].size, plan.expert[i] ? edp.size() : dp_.size(), options_.zero));
  const PaddedSizes sizes = padded_sizes(plan, options_.zero, dp_.size(), edp.size());
  buffer_elements_ = sizes.total;
  largest_padded_ = sizes.largest;
  layout_ = std::move(plan.buckets);
  expert_bucket_ = std::move(plan.expert);
  ready_.assign(layout_.size(), 0);
  launched_.assign(layout_.size(), false);
  partials_.assign(layout_.size(), 0);
  partial_ready_.assign(layout_.size(), 0);
  final_only_.assign(layout_.size(), false);
  int64_t acc = 0;  // the owned real elements of each bucket, in order
  for (size_t i = 0; i < layout_.size(); ++i) {
    acc_offset_.push_back(acc);
    const coll::ProcessGroup& g = group_of(i);
    const auto c = coll::chunk_range(size_t(padded_[i]), g.size(), g.rank());
    acc += std::max<int64_t>(0, std::min(c.end(), layout_[i].size) - c.begin);
  }
  if (reduces_each_micro_batch() && grads_.data()) acc_.assign(size_t(acc), 0.0f);
}

void DataParallel::set_replicas(const coll::ProcessGroup& replicas) {
  SHARDLAB_CHECK(options_.zero == 3 && expert_ranges_.empty(), "HSDP replicates ZeRO-3's dense units only");
  replicas_ = replicas;
}

void DataParallel::begin_step() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
  if (std::find_if(partials_.begin(), partials_.end(), [](int n) { return n > 0; }) != partials_.end())
    std::fill(acc_.begin(), acc_.end(), 0.0f);
  std::fill(partials_.begin(), partials_.end(), 0);
  std::fill(partial_ready_.begin(), partial_ready_.end(), 0);
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

void DataParallel::grads_partial(int64_t offset, int64_t count) {
  if (options_.zero != 2 || !reduces_each_micro_batch()) return;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const Range& b = layout_[i];
    const int64_t lo = std::max(offset, b.begin), hi = std::min(offset + count, b.begin + b.size);
    if (hi <= lo) continue;
    partial_ready_[i] += hi - lo;
    if (partial_ready_[i] < b.size) continue;
    partial_ready_[i] -= b.size;
    reduce_partial(i);
  }
}

void DataParallel::set_final_only(const std::vector<Range>& ranges) {
  for (size_t b = 0; b < layout_.size(); ++b) {
    const Range& r = layout_[b];
    for (const Range& f : ranges)
      if (f.size > 0 && f.begin < r.end() && r.begin < f.end()) final_only_[b] = true;
  }
}

float* DataParallel::padded_copy(const float* bucket, size_t i) {
  pad_.assign(size_t(padded_[i]), 0.0f);
  std::copy_n(bucket, size_t(layout_[i].size), pad_.data());
  return pad_.data();
}

void DataParallel::launch(size_t i) {
  if (launched_[i]) return;
  launched_[i] = true;
  if (group_of(i).size() == 1) return;
  reduce(i, true);
}

void DataParallel::sum_owned_chunk(const Range& bucket, const coll::ProcessGroup& over) {
  SHARDLAB_CHECK(options_.zero == 1 || options_.zero == 2, "sum_owned_chunk: ZeRO 1/2 chunks only");
  const auto it = std::find_if(layout_.begin(), layout_.end(), [&](const Range& b) {
    return b.begin == bucket.begin && b.size == bucket.size;
  });
  SHARDLAB_CHECK(it != layout_.end(), "sum_owned_chunk: not one of the planned buckets");
  const auto i = static_cast<size_t>(it - layout_.begin());
  const coll::ProcessGroup& g = group_of(i);
  const auto chunk = coll::chunk_range(size_t(padded_[i]), g.size(), g.rank());
  const int64_t real = std::max<int64_t>(0, std::min(chunk.end(), bucket.size) - chunk.begin);
  float* p = model::shifted(grads_.data(), bucket.begin + chunk.begin);
  if (!p || real == chunk.size) {  // phantom, or no padding in this chunk
    coll::all_reduce(dev_, over, coll::Buffer(p, size_t(chunk.size)), coll::ReduceOp::kSum);
    return;
  }
  pad_.assign(size_t(chunk.size), 0.0f);
  std::copy_n(p, size_t(real), pad_.data());
  coll::all_reduce(dev_, over, coll::Buffer(pad_.data(), size_t(chunk.size)), coll::ReduceOp::kSum);
  std::copy_n(pad_.data(), size_t(real), p);
}

bool DataParallel::reduce_partial(size_t i) {
  if (!reduces_each_micro_batch() || launched_[i] || final_only_[i] || group_of(i).size() == 1) return false;
  ++partials_[i];
  reduce(i, false);
  return true;
}

void DataParallel::reduce(size_t i, bool final) {
  const coll::ProcessGroup& g = group_of(i);
  const Range& r = layout_[i];
  float* p = model::shifted(grads_.data(), r.begin);
  const size_t n = static_cast<size_t>(padded_[i]);  // on the wire: the padded bucket
  // Real math on a padded bucket reduces a zero-padded copy (the collective
  // returns with its data done) and copies the real elements back.
  const bool scratch = p && n > size_t(r.size);
  float* buf = scratch ? padded_copy(p, i) : p;
  // Expert buckets sum over edp (scaled by 1/dp in finish_grads); others average over dp.
  const coll::ReduceOp op = expert_bucket_[i] ? coll::ReduceOp::kSum : coll::ReduceOp::kAvg;
  if (half() && options_.overlap)  // torch DDP: into the bucket, divided by dp on the way
    dev_.run(dev_.compute(), "ddp.bucket_copy", half_copy_cost(r.size));
  coll::CollOptions opt;
  opt.after = dev_.compute().record();  // the bucket exists once backward produced it
  opt.elem_size = half() ? element_size(dev_.precision()) : grad_bytes();  // on the wire
  if (sharded_grads()) {
    const auto chunk = coll::chunk_range(n, g.size(), g.rank());
    float* mine = model::shifted(buf, chunk.begin);
    const int64_t real = std::max<int64_t>(0, std::min(chunk.end(), r.size) - chunk.begin);
    works_.push_back(coll::ireduce_scatter(dev_, g, coll::ConstBuffer(buf, n), coll::Buffer(mine, chunk.size), op, opt));
    ++reduce_scatters_;
    if (!final || partials_[i] > 0) accumulate(i, mine, chunk.size, real, final);
    if (!final) {  // the next micro-batch's gradients start from zero
      if (p) std::fill(p, p + r.size, 0.0f);
      return;
    }
    if (replicas_ && replicas_->size() > 1 && !expert_bucket_[i]) {  // HSDP: the chunk's mean over the replicas
      opt.after = partials_[i] > 0 ? acc_done_ : works_.back().event();
      works_.push_back(coll::iall_reduce(dev_, *replicas_, coll::ConstBuffer(mine, chunk.size),
                                         coll::Buffer(mine, chunk.size), coll::ReduceOp::kAvg, opt));
    }
    if (scratch && real > 0)  // the real part of the chunk
      std::copy(mine, mine + real, p + chunk.begin);
  } else {
    works_.push_back(coll::iall_reduce(dev_, g, coll::ConstBuffer(buf, n), coll::Buffer(buf, n), op, opt));
    if (scratch) std::copy_n(buf, size_t(r.size), p);
  }
}

// Megatron-FSDP's accumulation of a reduce-scattered chunk into the sharded
// gradient (megatron_fsdp.py, _process_post_backward_gradients: "It will be
// reduce-scattered and accumulated into gbuf"; DeepSpeed's ZeRO-2 likewise
// adds each reduced partition into its fp32 gradient partition): read the
// accumulator and the chunk, write the accumulator, fp32, after the
// reduce-scatter on its stream.
void DataParallel::accumulate(size_t i, float* mine, int64_t chunk, int64_t real, bool final) {
  Stream& comm = dev_.comm();
  comm.wait(works_.back().event());
  const double e = static_cast<double>(chunk);
  dev_.run(comm, options_.zero == 3 ? "fsdp.grad_acc" : "zero2.grad_acc", OpCost{e, 3 * e * grad_bytes()});
  acc_done_ = comm.record();
  if (!mine || real == 0) return;  // phantom: charged, not computed
  float* acc = acc_.data() + acc_offset_[i];
  if (final)
    for (int64_t k = 0; k < real; ++k) mine[k] += acc[k];
  else
    for (int64_t k = 0; k < real; ++k) acc[k] += mine[k];
}

void DataParallel::finish_grads() {
  const int64_t n = static_cast<int64_t>(grads_.size());
  const bool copies = half() && dp_.size() > 1;
  if (copies && !options_.overlap) {  // local DDP: flatten, then divide by dp
    dev_.run(dev_.compute(), "ddp.flatten", half_copy_cost(n));
    dev_.run(dev_.compute(), "ddp.scale", half_copy_cost(n));
  }
  for (size_t i = 0; i < layout_.size(); ++i) launch(i);
  for (const auto& w : works_) w.wait(dev_.compute());
  dev_.compute().wait(acc_done_);  // the last accumulation kernel (ZeRO-3)
  if (copies) dev_.run(dev_.compute(), "ddp.unflatten", half_copy_cost(n));  // back into the gradients
  scale_expert_buckets();
}

bool DataParallel::half() const {
  return options_.half_grads && dev_.precision() != Precision::kFp32;
}

int DataParallel::grad_bytes() const {
  return options_.grad_bf16 && dev_.precision() != Precision::kFp32 ? 2 : kGradElemBytes;
}

// One pass over `n` half-precision gradients: read one, write one.
OpCost DataParallel::half_copy_cost(int64_t n) const {
  const double e = static_cast<double>(n);
  return {e, 2 * e * element_size(dev_.precision())};
}

void DataParallel::scale_expert_buckets() {
  if (dp_.size() == 1 || expert_ranges_.empty()) return;
  const float s = 1.0f / static_cast<float>(dp_.size());
  int64_t total = 0;
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (!expert_bucket_[i]) continue;
    Range r = layout_[i];
    int64_t charged = r.size;
    if (sharded_grads()) {  // the padded chunk is charged (the same on every rank), its real part scaled
      const auto c = coll::chunk_range(static_cast<size_t>(padded_[i]), edp_->size(), edp_->rank());
      charged = c.size;
      r = {r.begin + c.begin, std::max<int64_t>(0, std::min(c.end(), r.size) - c.begin)};
    }
    if (grads_.data())  // phantom: charged, not computed
      for (float& g : grads_.subspan(size_t(r.begin), size_t(r.size))) g *= s;
    total += charged;
  }
  const double n = static_cast<double>(total);
  dev_.run(dev_.compute(), "ep.grad_scale", OpCost{n, 2 * n * grad_bytes()});
}

void DataParallel::gather_params(std::span<float> params) {
  if (options_.zero == 0 || options_.zero == 3 || options_.defer_param_gather) return;  // ZeRO-3: Fsdp gathers
  std::vector<coll::Work> works;
  for (size_t i = 0; i < layout_.size(); ++i)
    if (auto w = gather_bucket(i, params)) works.push_back(*w);
  for (const auto& w : works) w.wait(dev_.compute());
}

std::optional<coll::Work> DataParallel::gather_bucket(size_t i, std::span<float> params) {
  const coll::ProcessGroup& g = group_of(i);
  if (g.size() == 1) return std::nullopt;
  const Range& b = layout_[i];
  float* p = model::shifted(params.data(), b.begin);
  const size_t n = static_cast<size_t>(padded_[i]);
  const bool scratch = p && n > size_t(b.size);  // real math: gathered into a padded copy
  float* buf = scratch ? padded_copy(p, i) : p;
  const auto c = coll::chunk_range(n, g.size(), g.rank());
  coll::CollOptions opt;
  opt.after = dev_.compute().record();  // issued now: overlaps what compute does next
  coll::Work w = coll::iall_gather(dev_, g, coll::ConstBuffer(model::shifted(buf, c.begin), c.size),
                                   coll::Buffer(buf, n), opt);
  if (scratch) std::copy_n(buf, size_t(b.size), p);  // the collective returned with its data done
  return w;
}

// Untimed (control messages: no port, no virtual time, no trace event),
// like the rest of publishing, which copies into the result on the host.
void DataParallel::gather_to_host(std::span<float> params) {
  if (!params.data()) return;  // phantom: no values
  constexpr Tag kHostGatherPhase = 0xFE;  // beside folded collectives' 0xFF
  for (size_t b = 0; b < layout_.size(); ++b) {
    const coll::ProcessGroup& g = group_of(b);
    if (g.size() == 1) continue;
    const Tag tag = g.next_tag() + kHostGatherPhase;
    const Range& r = layout_[b];
    float* p = params.data() + r.begin;
    // Rank i's chunk of the padded bucket, cut to the bucket's real elements.
    auto real = [&](int i) {
      const auto c = coll::chunk_range(size_t(padded_[b]), g.size(), i);
      return Range{c.begin, std::max<int64_t>(0, std::min(c.end(), r.size) - c.begin)};
    };
    const Range mine = real(g.rank());
    const auto* bytes = reinterpret_cast<const std::byte*>(p + mine.begin);
    for (int i = 0; i < g.size(); ++i)
      if (i != g.rank()) dev_.post_control(g.members()[size_t(i)], tag, {bytes, size_t(mine.size) * sizeof(float)});
    for (int i = 0; i < g.size(); ++i) {
      if (i == g.rank()) continue;
      const Range c = real(i);
      const Message m = dev_.take_control(g.members()[size_t(i)], tag);
      SHARDLAB_CHECK(m.payload.size() == size_t(c.size) * sizeof(float), "a host gather chunk of the wrong size");
      if (c.size > 0) std::memcpy(p + c.begin, m.payload.data(), m.payload.size());
    }
  }
}

uint64_t DataParallel::largest_bucket_bytes() const {
  return uint64_t(largest_padded_) * kGradElemBytes;
}

int64_t DataParallel::held_grad_elements() const {
  const auto largest = static_cast<int64_t>(largest_bucket_bytes() / kGradElemBytes);
  return parallel::held_grad_elements(buffer_elements_, owned_elements_, largest, options_.zero);
}

std::vector<Range> backward_ready_order(const std::vector<ShardSpec>& shards) {
  // ln_f first, then blocks from last to first, then the embeddings; inside a
  // group from the highest offset down, so consecutive tensors are adjacent.
  int max_layer = -1;
  for (const auto& s : shards) max_layer = std::max(max_layer, s.layer);
  auto key = [&](const ShardSpec& s) {
    if (s.layer >= 0) return s.layer;
    return s.is_final_norm() ? max_layer + 1 : -1;
  };
  std::vector<const ShardSpec*> order;
  for (const auto& s : shards) order.push_back(&s);
  std::sort(order.begin(), order.end(), [&](const ShardSpec* a, const ShardSpec* b) {
    return key(*a) != key(*b) ? key(*a) > key(*b) : a->offset > b->offset;
  });
  std::vector<Range> out;
  for (const ShardSpec* s : order) out.push_back({s->offset, s->numel});
  return out;
}

}  // namespace shardlab::parallel

namespace shardlab::parallel {

BucketPlan chunk_bucket_plan(const std::vector<ShardSpec>& shards,
                             const std::function<int(const ShardSpec&)>& chunk_of,
                             const std::vector<Range>& experts, Range alone) {
  std::map<int64_t, const ShardSpec*> by_offset;
  for (const ShardSpec& s : shards) by_offset[s.offset] = &s;
  // Each chunk's ranges in ready order; chunks in the order backward finishes their first range.
  std::vector<std::pair<int, std::vector<Range>>> chunks;
  for (const Range& r : backward_ready_order(shards)) {
    const int c = chunk_of(*by_offset.at(r.begin));
    auto it = std::find_if(chunks.begin(), chunks.end(), [&](const auto& e) { return e.first == c; });
    if (it == chunks.end()) it = chunks.insert(chunks.end(), {c, {}});
    it->second.push_back(r);
  }
  BucketPlan plan;
  for (const auto& [c, ranges] : chunks) {
    const BucketPlan part = plan_buckets(ranges, experts, std::numeric_limits<uint64_t>::max(), kGradElemBytes, alone);
    plan.buckets.insert(plan.buckets.end(), part.buckets.begin(), part.buckets.end());
    plan.expert.insert(plan.expert.end(), part.expert.begin(), part.expert.end());
  }
  return plan;
}

std::vector<Range> expert_ranges(const std::vector<ShardSpec>& shards) {
  std::vector<Range> out;
  for (const ShardSpec& s : shards) {
    if (s.expert) out.push_back({s.offset, s.numel});
  }
  return out;
}

}  // namespace shardlab::parallel
