#include "model/serve/speculative.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

#include "model/infer/sampler.h"
#include "model/rng.h"
#include "runtime/errors.h"

namespace shardlab::serve {

using model::Token;

SpeculativeSpec parse_speculative(const std::string& text) {
  const std::string usage = fmt::format("`speculative` {}: expected draft=PRESET,k=N[,accept=P]", text);
  SpeculativeSpec s;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t eq = part.find('=');
    if (eq == std::string::npos) throw ConfigError(usage);
    const std::string key = part.substr(0, eq), value = part.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    const bool number = !value.empty() && end == value.c_str() + value.size();
    if (key == "draft" && !value.empty() && s.draft.empty()) s.draft = value;
    else if (key == "k" && number && v == std::floor(v) && v >= 1 && v <= 64 && s.k == 0) s.k = int(v);
    else if (key == "accept" && number && v >= 0 && v <= 1 && s.accept < 0) s.accept = v;
    else throw ConfigError(usage + fmt::format(" ('{}': k in [1, 64], accept in [0, 1], each once)", part));
  }
  if (s.draft.empty() || s.k == 0) throw ConfigError(usage);
  return s;
}

int accept_greedy(std::span<const Token> drafts, std::span<const Token> target) {
  SHARDLAB_CHECK(target.size() == drafts.size() + 1, "verification: one target token per proposal and one more");
  int n = 0;
  while (size_t(n) < drafts.size() && drafts[size_t(n)] == target[size_t(n)]) ++n;
  return n;
}

int accept_at_rate(double rate, int drafts, uint64_t seed, int request, int draw) {
  const uint64_t stream = model::stream_key(seed + uint64_t(request), "serve.speculative_accept");
  int n = 0;
  while (n < drafts && infer::Sampler::uniform(stream, (uint64_t(draw) << 16) | uint64_t(n)) < rate) ++n;
  return n;
}

Speculator::Speculator(Device& dev, const infer::InferPlan& plan, const SpeculativeShape& s, bool values,
                       uint64_t seed)
    : s_(s), seed_(seed), d_(dev, plan, s.draft, s.draft_seed, values ? s.draft_init : nullptr) {}

int Speculator::id_of(int seq, int max_tokens) {
  auto it = ids_.find(seq);
  if (it == ids_.end()) it = ids_.emplace(seq, cache().add_sequence(max_tokens)).first;
  return it->second;
}

std::vector<std::vector<Token>> Speculator::propose(std::span<const BatchEntry> batch) {
  const int context = d_.engine().config().block_size;
  std::vector<infer::SeqInput> in;
  std::vector<bool> wants;
  int most = 0;
  for (const BatchEntry& e : batch) {
    std::vector<Token> t;
    if (const auto owed = owed_.find(e.seq); owed != owed_.end()) {
      t = std::move(owed->second);
      owed_.erase(owed);
    }
    if (e.tokens.empty()) t.resize(t.size() + size_t(e.new_tokens - e.draft), 0);
    else t.insert(t.end(), e.tokens.begin(), e.tokens.end());
    in.push_back({id_of(e.seq, context), std::move(t)});
    wants.push_back(e.draft > 0);
    most = std::max(most, e.draft);
  }
  // Every entry's tokens, the first proposals from their last rows; then
  // proposal j of every entry with more than j to make, a step each.
  std::vector<std::vector<Token>> out(batch.size());
  infer::Sampler greedy{infer::SamplingOptions{}};
  for (int j = 0; j == 0 || j < most; ++j) {
    if (j > 0) {
      in.clear();
      wants.clear();
      for (size_t i = 0; i < batch.size(); ++i)
        if (batch[i].draft > j) {
          in.push_back({ids_.at(batch[i].seq), {out[i].back()}});
          wants.push_back(true);
        }
    }
    const std::vector<float> chosen = d_.choose(d_.engine().step(in), wants, greedy);
    size_t k = 0;
    for (size_t i = 0; i < batch.size(); ++i)
      if (batch[i].draft > j) out[i].push_back(Token(chosen[k++]));
  }
  return out;
}

Speculator::Verified Speculator::verify(infer::InferDevice& target, const infer::StepOutput& o,
                                       std::span<const BatchEntry> batch, const std::vector<std::vector<Token>>& proposed,
                                       std::span<const int> target_ids) {
  const model::GPTConfig& m = target.engine().config();
  infer::Sampler greedy{infer::SamplingOptions{}};
  auto row = [&](size_t r) {
    return greedy.next({o.logits.data() + r * size_t(m.vocab_size), size_t(m.token_vocab())});
  };
  Verified v;
  size_t r = 0;
  int64_t scored = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    const int rows = e.draft + 1;
    if (!e.samples) {  // a chunk short of its prompt's end: its row is not used
      ++r;
      continue;
    }
    std::vector<Token> t;
    for (int j = 0; j < rows && !o.logits.empty(); ++j) t.push_back(row(r + size_t(j)));
    r += size_t(rows);
    scored += rows;
    const int kept = o.logits.empty() ? accept_at_rate(s_.accept, e.draft, seed_, e.request, e.draw)
                                      : accept_greedy(proposed[i], t);
    for (int j = 0; j <= kept; ++j) v.tokens.push_back(t.empty() ? 0.0f : float(t[size_t(j)]));
    v.counts.push_back(kept + 1);
    if (e.draft == 0) continue;
    infer::KvCache& cache = target.engine().cache();  // keep the last token and the accepted proposals
    cache.truncate(target_ids[i], cache.length(target_ids[i]) - (e.draft - kept));
    settle(e.seq, e.draft, kept, proposed[i]);
  }
  target.charge_choice(scored);
  return v;
}

void Speculator::settle(int seq, int drafts, int accepted, const std::vector<Token>& proposed) {
  if (drafts == 0) return;
  // The draft read its last token and proposals 1..drafts-1: keep those accepted.
  const int id = ids_.at(seq);
  const int read = drafts - 1, kept = std::min(accepted, read);
  cache().truncate(id, cache().length(id) - (read - kept));
  if (accepted == drafts) owed_[seq] = {proposed.back()};
}

void Speculator::release(int seq) {
  owed_.erase(seq);
  const auto it = ids_.find(seq);
  if (it == ids_.end()) return;
  cache().release(it->second);
  ids_.erase(it);
}

}  // namespace shardlab::serve
