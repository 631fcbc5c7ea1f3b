#include "model/serve/speculative.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include <fmt/format.h>

#include "model/infer/sampler.h"
#include "model/rng.h"
#include "runtime/errors.h"
#include "runtime/parse_number.h"

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
    const std::optional<double> parsed = parse_number<double>(value);  // the one rule for a number (no hex, nan)
    const bool number = parsed.has_value();
    const double v = parsed.value_or(0);
    if (key == "draft" && !value.empty() && s.draft.empty()) s.draft = value;
    else if (key == "k" && number && v == std::floor(v) && v >= 1 && v <= 64 && s.k == 0) s.k = int(v);
    else if (key == "accept" && number && v >= 0 && v <= 1 && s.accept < 0) s.accept = v;
    else throw ConfigError(usage + fmt::format(" ('{}': k in [1, 64], accept in [0, 1], each once)", part));
  }
  if (s.draft.empty() || s.k == 0) throw ConfigError(usage);
  return s;
}

Token pick(std::span<const double> p, double v) {
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  double acc = 0;
  Token last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    acc += p[i];
    last = Token(i);
    if (v * total < acc) return last;
  }
  return last;
}

std::pair<Token, bool> verify_sampled(std::span<const double> p, std::span<const double> q, Token x, double u,
                                      double v) {
  SHARDLAB_CHECK(p.size() == q.size() && q[size_t(x)] > 0, "sampled verification: x must be drawn from q");
  if (u * q[size_t(x)] < p[size_t(x)]) return {x, true};
  std::vector<double> residual(p.size());
  for (size_t i = 0; i < p.size(); ++i) residual[i] = std::max(0.0, p[i] - q[i]);
  return {pick(residual, v), false};
}

int accept_at_rate(double rate, int drafts, uint64_t seed, int request, int draw) {
  const uint64_t stream = model::stream_key(seed + uint64_t(request), "serve.speculative_accept");
  int n = 0;
  while (n < drafts && infer::Sampler::uniform(stream, (uint64_t(draw) << 16) | uint64_t(n)) < rate) ++n;
  return n;
}

Speculator::Speculator(Device& dev, const infer::InferPlan& plan, const SpeculativeShape& s, bool values,
                       const infer::SamplingOptions& sampling)
    : s_(s), sampling_(sampling), sampler_(sampling), d_(dev, plan, s.draft, s.draft_seed, values ? s.draft_init : nullptr) {}

double Speculator::uniform(const BatchEntry& e, const char* name, int j) const {
  const uint64_t stream = model::stream_key(sampling_.seed + uint64_t(e.request), name);
  return infer::Sampler::uniform(stream, (uint64_t(e.draw) << 16) | uint64_t(j));
}

int Speculator::id_of(int seq, int max_tokens) {
  auto it = ids_.find(seq);
  if (it == ids_.end()) it = ids_.emplace(seq, cache().add_sequence(max_tokens)).first;
  return it->second;
}

std::vector<std::vector<Token>> Speculator::propose(std::span<const BatchEntry> batch) {
  const int context = d_.engine().config().block_size, V = d_.engine().config().vocab_size;
  const size_t vocab = size_t(d_.engine().config().token_vocab());
  std::vector<infer::SeqInput> in;
  std::vector<size_t> who;  // the entry of each input
  int most = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    std::vector<Token> t;
    if (const auto owed = owed_.find(e.seq); owed != owed_.end()) {
      t = std::move(owed->second);
      owed_.erase(owed);
    }
    if (e.tokens.empty()) t.resize(t.size() + size_t(e.new_tokens - e.draft), 0);
    else t.insert(t.end(), e.tokens.begin(), e.tokens.end());
    in.push_back({id_of(e.seq, context), std::move(t)});
    who.push_back(i);
    most = std::max(most, e.draft);
  }
  // Every entry's tokens, the first proposals from their last rows; then
  // proposal j of every entry with more than j to make, a step each. Greedy
  // takes the draft's top token; sampling draws from its distribution q.
  std::vector<std::vector<Token>> out(batch.size());
  q_.assign(batch.size(), {});
  for (int j = 0; j == 0 || j < most; ++j) {
    if (j > 0) {
      in.clear();
      who.clear();
      for (size_t i = 0; i < batch.size(); ++i)
        if (batch[i].draft > j) {
          in.push_back({ids_.at(batch[i].seq), {out[i].back()}});
          who.push_back(i);
        }
    }
    const infer::StepOutput o = d_.engine().step(in);
    int64_t chosen = 0;
    for (size_t r = 0; r < who.size(); ++r) {
      const size_t i = who[r];
      if (batch[i].draft <= j) continue;
      ++chosen;
      if (o.logits.empty()) {  // shapes only
        out[i].push_back(0);
        continue;
      }
      q_[i].emplace_back();
      sampler_.distribution({o.logits.data() + r * size_t(V), vocab}, q_[i].back());
      out[i].push_back(pick(q_[i].back(), uniform(batch[i], "serve.spec.draft", j)));
    }
    d_.charge_choice(chosen);
  }
  return out;
}

// The target's token at position j of entry e (row `row` of its logits):
// at a proposal, the verification's (`kept`: the proposal stands); after
// the proposals, its own draw (greedy: the top token), as without a draft.
Token Speculator::verify_at(const model::GPTConfig& m, const infer::StepOutput& o, size_t row, const BatchEntry& e,
                            int j, std::span<const Token> proposed, const std::vector<std::vector<double>>& q,
                            bool& kept) {
  const std::span<const float> logits{o.logits.data() + row * size_t(m.vocab_size), size_t(m.token_vocab())};
  kept = false;
  if (j == e.draft) return sampler_.draw(logits, sampling_.seed + uint64_t(e.request), uint64_t(e.draw + j));
  if (sampling_.temperature <= 0) {
    const Token t = sampler_.draw(logits, 0, 0);
    kept = t == proposed[size_t(j)];
    return t;
  }
  sampler_.distribution(logits, p_);
  const auto [t, keep] = verify_sampled(p_, q[size_t(j)], proposed[size_t(j)], uniform(e, "serve.spec.accept", j),
                                        uniform(e, "serve.spec.residual", j));
  kept = keep;
  return t;
}

Speculator::Verified Speculator::verify(infer::InferDevice& target, const infer::StepOutput& o,
                                       std::span<const BatchEntry> batch, const std::vector<std::vector<Token>>& proposed,
                                       std::span<const int> target_ids) {
  Verified v;
  size_t r = 0;
  int64_t scored = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    if (!e.samples) {  // a chunk short of its prompt's end: its row is not used
      ++r;
      continue;
    }
    int kept = 0;
    if (o.logits.empty()) {  // shapes only: the stated rate
      kept = accept_at_rate(s_.accept, e.draft, sampling_.seed, e.request, e.draw);
      v.tokens.insert(v.tokens.end(), size_t(kept + 1), 0.0f);
    } else {
      bool keep = true;
      for (int j = 0; keep; ++j) {
        v.tokens.push_back(float(verify_at(target.engine().config(), o, r + size_t(j), e, j, proposed[i], q_[i], keep)));
        kept = j;
      }
    }
    r += size_t(e.draft + 1);
    scored += e.draft + 1;
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
