#include "collectives/replay_share.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace shardlab::collectives::detail {

namespace {

struct Texts {
  std::mutex mu;
  std::unordered_map<std::string, std::unique_ptr<const std::string>> interned;  // GUARDED_BY(mu)
};

size_t hash_of(const ReplayInputs& in) {
  size_t h = std::hash<const void*>()(in.profile);
  auto mix = [&h](uint64_t v) { h ^= size_t(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (int m : in.members) mix(uint64_t(m));
  mix(uint64_t(in.shape.op));
  mix(in.shape.count);
  mix(uint64_t(in.shape.elem_size));
  mix(uint64_t(in.shape.root));
  mix(uint64_t(in.shape.proto));
  mix(uint64_t(in.algo));
  for (const MemberClock& c : in.clocks) {
    mix(uint64_t(c.now));
    for (int p = 0; p < kNumLinkClasses; ++p) {
      mix(uint64_t(c.egress[p]));
      mix(uint64_t(c.ingress[p]));
    }
  }
  mix(uint64_t(in.stream));
  for (const Port& port : in.ports) {
    mix(port.segments().size());
    for (int k = 0; k < Port::kStreams; ++k) mix(uint64_t(port.free(k)));
  }
  return h;
}

// One call's replay: filled once by the first consumer; `left` consumers still to take it.
struct Entry {
  ReplayInputs in;  // immutable once in the table
  std::once_flag once;
  SharedReplay result;
  int left = 0;  // GUARDED_BY(Table::mu)
};
struct Table {
  std::mutex mu;
  std::unordered_multimap<size_t, std::shared_ptr<Entry>> entries;  // GUARDED_BY(mu), by hash_of
};
Table& table() {
  static Table t;
  return t;
}
std::atomic<uint64_t> replayed_count{0}, reused_count{0};

// The replay of `in`, booking on `ports` (in.ports or a copy of them).
SharedReplay replay(const HardwareProfile& p, const ReplayInputs& in, std::vector<Port> ports,
                    std::span<const char> need) {
  SharedReplay r;
  r.ports = std::move(ports);
  const ReplayPorts replay_ports{r.ports, in.stream};
  r.outcome = replay_outcome(p, in.members, in.shape, in.algo, in.clocks, need,
                             r.ports.empty() ? nullptr : &replay_ports);
  return r;
}

}  // namespace

const std::string* interned_profile_text(const HardwareProfile& p) {
  static Texts texts;
  // A device thread lives for one run on one profile: once per thread.
  thread_local const HardwareProfile* text_of = nullptr;
  thread_local const std::string* text = nullptr;
  if (text_of != &p) {
    std::string t = profile_to_json(p).dump();
    const std::lock_guard<std::mutex> lock(texts.mu);
    auto it = texts.interned.find(t);
    if (it == texts.interned.end()) {
      auto owned = std::make_unique<const std::string>(t);
      it = texts.interned.emplace(std::move(t), std::move(owned)).first;
    }
    text = it->second.get();
    text_of = &p;
  }
  return text;
}

std::shared_ptr<const SharedReplay> shared_replay(const HardwareProfile& p, ReplayInputs in, int consumers,
                                                  std::span<const char> need) {
  if (consumers <= 1) {  // the caller's inputs are its own: the replay books on its ports
    std::vector<Port> ports = std::move(in.ports);
    return std::make_shared<const SharedReplay>(replay(p, in, std::move(ports), need));
  }
  Table& t = table();
  const size_t h = hash_of(in);
  std::shared_ptr<Entry> e;
  {
    const std::lock_guard<std::mutex> lock(t.mu);
    for (auto [it, end] = t.entries.equal_range(h); it != end && !e; ++it)
      if (it->second->in == in) e = it->second;
    if (!e) {
      if (t.entries.size() >= kMaxSharedReplays) t.entries.clear();  // consumers hold their entries
      e = std::make_shared<Entry>();
      e->in = std::move(in);
      e->left = consumers;
      t.entries.emplace(h, e);
    }
  }
  // The last consumer takes the entry out, whether the replay threw or not.
  struct Leave {
    Table& t;
    const std::shared_ptr<Entry>& e;
    size_t h;
    ~Leave() {
      const std::lock_guard<std::mutex> lock(t.mu);
      if (--e->left > 0) return;
      for (auto [it, end] = t.entries.equal_range(h); it != end; ++it)
        if (it->second == e) {
          t.entries.erase(it);
          break;
        }
    }
  } leave{t, e, h};
  bool replayed = false;
  std::call_once(e->once, [&] {
    const std::vector<char> all(e->in.members.size(), 1);
    e->result = replay(p, e->in, e->in.ports, all);  // the entry keeps its inputs to compare
    replayed = true;
  });
  (replayed ? replayed_count : reused_count).fetch_add(1, std::memory_order_relaxed);
  return {e, &e->result};
}

ReplayShareCounts replay_share_counts() {
  return {replayed_count.load(std::memory_order_relaxed), reused_count.load(std::memory_order_relaxed)};
}

}  // namespace shardlab::collectives::detail
