#include "model/parallel/data/param_gather.h"

#include <algorithm>
#include <limits>

#include "runtime/errors.h"

namespace shardlab::parallel {

namespace coll = collectives;

namespace {
constexpr size_t kNone = std::numeric_limits<size_t>::max();

bool overlaps(const Range& a, const Range& b) {
  return std::max(a.begin, b.begin) < std::min(a.end(), b.end());
}
}  // namespace

ParamGather::ParamGather(Device& dev, DataParallel& dp, std::span<float> params,
                         const std::vector<FsdpUnit>& units, const FsdpPasses& passes, int pp_rank, int pp)
    : dev_(dev), dp_(dp), params_(params), pp_rank_(pp_rank), pp_(pp) {
  SHARDLAB_CHECK(dp.zero() == 1 || dp.zero() == 2, "overlapped parameter gathers are ZeRO 1 and 2's");
  const std::vector<Range>& buckets = dp.buckets();
  std::map<int, const FsdpUnit*> unit_of;
  for (const FsdpUnit& u : units) unit_of[u.id] = &u;
  std::vector<bool> placed(buckets.size(), false);
  aligned_ = passes.chunks.size() > 1;
  for (size_t c = 0; c < passes.chunks.size(); ++c) {
    chunk_buckets_.emplace_back();
    for (size_t i = 0; i < passes.chunks[c].size(); ++i) {
      const int point = passes.chunks[c][i];
      if (i == 0) chunk_start_[point] = c;
      std::vector<size_t>& mine = at_point_[point];
      for (size_t b = 0; b < buckets.size(); ++b) {
        if (placed[b]) continue;
        bool used = false;
        for (int id : passes.needs.at(point))
          for (const Range& r : unit_of.at(id)->ranges) used = used || overlaps(r, buckets[b]);
        if (!used) continue;
        placed[b] = true;
        mine.push_back(b);
        chunk_buckets_[c].push_back(b);
        order_.push_back(b);
      }
    }
  }
  SHARDLAB_CHECK(std::all_of(placed.begin(), placed.end(), [](bool p) { return p; }),
                 "a data-parallel bucket no hook point uses");
  next_.assign(buckets.size(), kNone);
  for (size_t k = 0; k + 1 < order_.size(); ++k) next_[order_[k]] = order_[k + 1];
  state_.assign(buckets.size(), State::kStale);
  works_.resize(buckets.size());
}

void ParamGather::begin_step() {
  forwards_ = 0;
  // The interleaved schedule syncs its first two chunks as it starts, before
  // its warmup's first receive (schedules.py: "Synchronize params for first
  // two model chunks"), so a stage waiting for its first input gathers meanwhile.
  if (aligned_) launch_chunk(0), launch_chunk(1);
}

void ParamGather::updated() {
  SHARDLAB_CHECK(std::none_of(state_.begin(), state_.end(), [](State s) { return s == State::kInFlight; }),
                 "a parameter all-gather still in flight at the optimizer step");
  std::fill(state_.begin(), state_.end(), State::kStale);
}

void ParamGather::launch(size_t b) {
  if (state_[b] != State::kStale) return;
  state_[b] = State::kInFlight;
  works_[b] = dp_.gather_bucket(b, params_);
  if (!works_[b]) return;
  ++gathers_;
  gathered_bytes_ += uint64_t(dp_.padded(b)) * uint64_t(element_size(dev_.precision()));
}

void ParamGather::launch_chunk(size_t chunk) {
  if (chunk < chunk_buckets_.size())
    for (size_t b : chunk_buckets_[chunk]) launch(b);
}

void ParamGather::wait(size_t b) {
  launch(b);
  state_[b] = State::kDone;
  if (!works_[b]) return;
  Stream& compute = dev_.compute();
  exposed_ += std::max(compute.now(), works_[b]->event().time) - compute.now();
  works_[b]->wait(compute);
  works_[b].reset();
}

void ParamGather::before_forward(int point) {
  if (aligned_ && chunk_start_.count(point)) {  // a chunk's micro-batch forward begins
    const int id = forwards_ + pp_rank_;
    const int chunks = int(chunk_buckets_.size());
    if (id % pp_ == 0 && id < pp_ * chunks) launch_chunk(size_t(id / pp_ + 1));
    ++forwards_;
  }
  const auto it = at_point_.find(point);
  if (it == at_point_.end()) return;
  for (size_t b : it->second) {
    if (state_[b] == State::kDone) continue;
    wait(b);
    if (!aligned_ && next_[b] != kNone) launch(next_[b]);
  }
}

void ParamGather::finish() {
  for (size_t b : order_) launch(b);
  for (size_t b : order_)
    if (state_[b] != State::kDone) wait(b);
}

void ParamGather::finish_on_host() {
  SHARDLAB_CHECK(std::none_of(state_.begin(), state_.end(), [](State s) { return s == State::kInFlight; }),
                 "a parameter all-gather still in flight at the end of the run");
  dp_.gather_to_host(params_);
  std::fill(state_.begin(), state_.end(), State::kDone);
}

}  // namespace shardlab::parallel
