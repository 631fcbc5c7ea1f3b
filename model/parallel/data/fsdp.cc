#include "model/parallel/data/fsdp.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "model/buffer.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

namespace coll = collectives;

namespace {

constexpr int kNoPoint = INT_MIN;

bool holds_role(const std::vector<ShardSpec>& shards, model::ParamRole role) {
  return std::any_of(shards.begin(), shards.end(), [&](const ShardSpec& s) { return s.role == role; });
}

// The unit a tensor belongs to (fsdp.h: wte joins the embeddings where wpe is).
int unit_of(const ShardSpec& s, bool holds_wpe, int n_layer) {
  if (s.layer >= 0) return s.layer;
  if (s.is_final_norm() || s.role == model::ParamRole::kLmHead) return n_layer;
  if (s.role == model::ParamRole::kTokenEmbedding) return holds_wpe ? kEmbeddingsUnit : n_layer;
  return kEmbeddingsUnit;
}

}  // namespace

int64_t FsdpUnit::elements() const {
  int64_t n = 0;
  for (const Range& r : ranges) n += r.size;
  return n;
}

std::vector<FsdpUnit> fsdp_units(const std::vector<ShardSpec>& shards, int n_layer) {
  const bool holds_wpe = holds_role(shards, model::ParamRole::kPositionEmbedding);
  std::map<int64_t, const ShardSpec*> by_offset;
  for (const ShardSpec& s : shards) by_offset[s.offset] = &s;
  std::vector<FsdpUnit> units;
  for (const Range& r : backward_ready_order(shards)) {
    if (r.size <= 0) continue;
    const int id = unit_of(*by_offset.at(r.begin), holds_wpe, n_layer);
    auto it = std::find_if(units.begin(), units.end(), [&](const FsdpUnit& u) { return u.id == id; });
    if (it == units.end()) it = units.insert(units.end(), FsdpUnit{id, {}});
    it->ranges.push_back(r);
  }
  return units;
}

BucketPlan fsdp_bucket_plan(const std::vector<FsdpUnit>& units, const std::vector<Range>& experts) {
  BucketPlan plan;
  for (const FsdpUnit& u : units) {
    // No size limit: a bucket closes only at a gap or an expert boundary.
    const BucketPlan part =
        plan_buckets(u.ranges, experts, std::numeric_limits<uint64_t>::max(), kGradElemBytes);
    plan.buckets.insert(plan.buckets.end(), part.buckets.begin(), part.buckets.end());
    plan.expert.insert(plan.expert.end(), part.expert.begin(), part.expert.end());
  }
  return plan;
}

FsdpPasses fsdp_passes(const std::vector<HookChunk>& chunks, const std::vector<FsdpUnit>& units,
                       const std::vector<ShardSpec>& shards, int n_layer) {
  std::set<int> held;
  for (const FsdpUnit& u : units) held.insert(u.id);
  const bool holds_wpe = holds_role(shards, model::ParamRole::kPositionEmbedding);
  FsdpPasses p;
  auto add = [&](std::vector<int>& seq, int point, std::vector<int> needs) {
    seq.push_back(point);
    std::vector<int>& n = p.needs[point];
    for (int u : needs)
      if (held.count(u) && std::find(n.begin(), n.end(), u) == n.end()) n.push_back(u);
  };
  // wte's unit: the embeddings' where wpe is, else the head's (a model
  // without a position table, llama, keeps it there on its first stage too).
  const int wte_unit = holds_wpe ? kEmbeddingsUnit : n_layer;
  const bool tied = !holds_role(shards, model::ParamRole::kLmHead);
  for (const HookChunk& c : chunks) {
    std::vector<int> seq;
    if (c.embeddings) add(seq, kEmbeddingsUnit, {kEmbeddingsUnit, wte_unit});
    for (int l = c.first_layer; l < c.end_layer; ++l) add(seq, l, {l});
    if (c.head) {
      const bool wte = holds_role(shards, model::ParamRole::kTokenEmbedding);
      add(seq, n_layer, {n_layer, wte && tied ? wte_unit : n_layer});
    }
    p.chunks.push_back(std::move(seq));
  }
  return p;
}

int64_t fsdp_peak_gathered(const FsdpPasses& passes, const std::vector<FsdpUnit>& units,
                           const FsdpOptions& options) {
  std::map<int, int64_t> size;
  int64_t all = 0;
  for (const FsdpUnit& u : units) all += size[u.id] = u.elements();
  if (!options.reshard_after_forward) return all;
  int64_t peak = 0;
  for (const std::vector<int>& fwd : passes.chunks) {
    for (const bool forward : {true, false}) {
      std::vector<int> seq = fwd;
      if (!forward) std::reverse(seq.begin(), seq.end());
      std::set<int> present;
      for (size_t i = 0; i < seq.size(); ++i) {
        for (int u : passes.needs.at(seq[i])) present.insert(u);
        if (options.prefetch && i + 1 < seq.size())
          for (int u : passes.needs.at(seq[i + 1])) present.insert(u);
        int64_t now = 0;
        for (int u : present) now += size[u];
        peak = std::max(peak, now);
        for (int u : passes.needs.at(seq[i])) {
          bool later = false;
          for (size_t j = i + 1; j < seq.size(); ++j) {
            const std::vector<int>& n = passes.needs.at(seq[j]);
            later = later || std::find(n.begin(), n.end(), u) != n.end();
          }
          if (!later) present.erase(u);
        }
      }
    }
  }
  return peak;
}

Fsdp::Fsdp(Device& dev, DataParallel& dp, std::span<float> params, std::vector<FsdpUnit> units,
           FsdpPasses passes, const FsdpOptions& options)
    : dev_(dev),
      dp_(dp),
      params_(params),
      options_(options),
      passes_(std::move(passes)),
      units_(std::move(units)),
      buckets_(units_.size()),
      live_(units_.size()) {
  SHARDLAB_CHECK(dp.zero() == 3, "FSDP needs DataParallel planned for ZeRO-3");
  for (size_t u = 0; u < units_.size(); ++u) index_[units_[u].id] = u;
  for (size_t b = 0; b < dp.buckets().size(); ++b) {
    const Range& r = dp.buckets()[b];
    bool found = false;
    for (size_t u = 0; u < units_.size() && !found; ++u)
      for (const Range& ur : units_[u].ranges)
        if (ur.contains(r.begin)) {  // buckets never span units (fsdp_bucket_plan)
          buckets_[u].push_back(b);
          found = true;
          break;
        }
    SHARDLAB_CHECK(found, "a ZeRO-3 bucket outside every unit");
  }
  for (size_t c = 0; c < passes_.chunks.size(); ++c)
    for (size_t i = 0; i < passes_.chunks[c].size(); ++i) at_[passes_.chunks[c][i]] = {c, i};
}

void Fsdp::before_forward(int point) { acquire_point(point, true); }
void Fsdp::after_forward(int point) { release_point(point, true, options_.reshard_after_forward); }
void Fsdp::before_backward(int point) { acquire_point(point, false); }
void Fsdp::after_backward(int point) {
  reduce_finished(point);
  release_point(point, false, true);
}

void Fsdp::reduce_finished(int point) {
  const auto needs = passes_.needs.find(point);
  if (!dp_.reduces_each_micro_batch() || needs == passes_.needs.end()) return;
  for (int u : needs->second) {
    if (needed_later(point, u, false)) continue;  // more of its gradients come later in this pass
    for (size_t b : buckets_[index_.at(u)]) dp_.reduce_partial(b);  // not a final-only one
  }
}

void Fsdp::acquire_point(int point, bool forward) {
  const auto needs = passes_.needs.find(point);
  if (needs == passes_.needs.end()) return;
  for (int u : needs->second) {
    if (!live_[index_.at(u)].present) issue(u);
    wait(u);
  }
  const int next = options_.prefetch ? next_point(point, forward) : kNoPoint;
  if (next == kNoPoint) return;
  for (int u : passes_.needs.at(next))  // overlaps this point's compute
    if (!live_[index_.at(u)].present) issue(u);
}

void Fsdp::release_point(int point, bool forward, bool reshard) {
  const auto needs = passes_.needs.find(point);
  if (!reshard || needs == passes_.needs.end()) return;
  for (int u : needs->second)
    if (!needed_later(point, u, forward)) free(u);
}

bool Fsdp::needed_later(int point, int unit, bool forward) const {
  const auto [c, pos] = at_.at(point);
  const std::vector<int>& seq = passes_.chunks[c];
  for (size_t j = 0; j < seq.size(); ++j) {
    if (forward ? j <= pos : j >= pos) continue;
    const std::vector<int>& n = passes_.needs.at(seq[j]);
    if (std::find(n.begin(), n.end(), unit) != n.end()) return true;
  }
  return false;
}

int Fsdp::next_point(int point, bool forward) const {
  const auto [c, pos] = at_.at(point);
  const std::vector<int>& seq = passes_.chunks[c];
  if (forward) return pos + 1 < seq.size() ? seq[pos + 1] : kNoPoint;
  return pos > 0 ? seq[pos - 1] : kNoPoint;
}

void Fsdp::issue(int unit) {
  const size_t u = index_.at(unit);
  Live& l = live_[u];
  const int64_t n = units_[u].elements();
  l.memory = Tensor(dev_.arena(), unit == kEmbeddingsUnit ? "fsdp.gathered embeddings" : fmt::format("fsdp.gathered unit {}", unit),
                    {n}, MemKind::kParam, dev_.precision(), /*phantom=*/true);
  l.present = true;
  gather_buckets(unit, l.works);
  ++gathers_;
  gathered_bytes_ += uint64_t(n) * uint64_t(element_size(dev_.precision()));
}

void Fsdp::gather_buckets(int unit, std::vector<coll::Work>& works) {
  for (size_t b : buckets_[index_.at(unit)])
    if (auto w = dp_.gather_bucket(b, params_)) works.push_back(*w);
}

void Fsdp::wait(int unit) {
  Live& l = live_[index_.at(unit)];
  Stream& compute = dev_.compute();
  Time done = compute.now();
  for (const coll::Work& w : l.works) done = std::max(done, w.event().time);
  exposed_ += done - compute.now();
  for (const coll::Work& w : l.works) w.wait(compute);
  l.works.clear();
}

void Fsdp::free(int unit) {
  const size_t u = index_.at(unit);
  if (!live_[u].works.empty()) wait(unit);
  live_[u].memory = Tensor();
  live_[u].present = false;
  if (!params_.data()) return;  // phantom: nothing to poison
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t b : buckets_[u]) {
    const coll::ProcessGroup& g = dp_.group_of(b);
    const Range& r = dp_.buckets()[b];
    const Range c = coll::chunk_range(size_t(r.size), g.size(), g.rank());
    float* p = params_.data() + r.begin;
    std::fill(p, p + c.begin, nan);
    std::fill(p + c.end(), p + r.size, nan);
  }
}

void Fsdp::shard() {
  for (const FsdpUnit& u : units_) free(u.id);
}

void Fsdp::gather_all_to_host() {
  for (const Live& l : live_) SHARDLAB_CHECK(!l.present, "a unit is still gathered at the end of the run");
  dp_.gather_to_host(params_);
}

}  // namespace shardlab::parallel
