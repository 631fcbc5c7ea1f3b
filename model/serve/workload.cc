#include "model/serve/workload.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "model/rng.h"
#include "runtime/errors.h"
#include "runtime/input_file.h"
#include "runtime/parse_number.h"
#include "runtime/text.h"

namespace shardlab::serve {

namespace {

// A whole-string number (parse_number.h's rule), or a ConfigError naming `what`.
double number(const std::string& s, const std::string& what) {
  const std::optional<double> v = parse_number<double>(s);
  if (!v) throw ConfigError(fmt::format("{}: '{}' is not a finite number", what, s));
  return *v;
}

// The latest arrival: the clocks are seconds in doubles, whose resolution at
// 1e6 s is about 0.1 ns; at 1e300 s a step's milliseconds vanished (every
// latency 0).
constexpr double kMaxArrivalS = 1e6;

int length(const std::string& s, const std::string& what) {
  const double v = number(s, what);
  if (v != std::floor(v) || v < 1 || v > 1e7)
    throw ConfigError(fmt::format("{}: '{}' is not a token count in [1, 10000000]", what, s));
  return static_cast<int>(v);
}

int sample(const LengthDist& d, uint64_t key, uint64_t index) {
  switch (d.kind) {
    case LengthDist::Kind::kConstant: return d.a;
    case LengthDist::Kind::kUniform: {
      const double u = model::uniform_at(key, index);  // (0, 1]
      const int v = d.a + static_cast<int>(std::ceil(u * (d.b - d.a + 1))) - 1;
      return std::min(std::max(v, d.a), d.b);
    }
    case LengthDist::Kind::kLognormal: {
      const double v = std::exp(std::log(d.median) + d.sigma * model::normal_at(key, index));
      return static_cast<int>(std::min<double>(std::max(std::round(v), 1.0), d.b));
    }
  }
  return d.a;
}

}  // namespace

LengthDist parse_length_dist(const std::string& text, const std::string& flag) {
  const std::vector<std::string> f = split<std::string>(text, ':');
  const std::string what = fmt::format("{} {}", flag, text);
  LengthDist d;
  if (text.empty()) {
    throw ConfigError(fmt::format("{}: empty; expected N, uniform:A:B or lognormal:MEDIAN:SIGMA[:MAX]", what));
  } else if (f.size() == 1) {
    d.a = d.b = length(f[0], what);
  } else if (f[0] == "uniform" && f.size() == 3) {
    d.kind = LengthDist::Kind::kUniform;
    d.a = length(f[1], what);
    d.b = length(f[2], what);
    if (d.b < d.a) throw ConfigError(fmt::format("{}: the upper bound is below the lower", what));
  } else if (f[0] == "lognormal" && (f.size() == 3 || f.size() == 4)) {
    d.kind = LengthDist::Kind::kLognormal;
    d.median = length(f[1], what);
    d.sigma = number(f[2], what);
    if (d.sigma < 0 || d.sigma > 4) throw ConfigError(fmt::format("{}: sigma must be in [0, 4]", what));
    d.b = f.size() == 4 ? length(f[3], what) : static_cast<int>(std::min(8 * d.median, 1e7));
  } else {
    throw ConfigError(fmt::format("{}: expected N, uniform:A:B or lognormal:MEDIAN:SIGMA[:MAX]", what));
  }
  return d;
}

Arrival parse_arrival(const std::string& text) {
  if (text == "burst") return {};
  const std::vector<std::string> f = split<std::string>(text, ':');
  if (f.size() != 2 || f[0] != "poisson")
    throw ConfigError(fmt::format("`arrival` {}: expected poisson:RATE or burst", text));
  Arrival a{Arrival::Kind::kPoisson, number(f[1], "`arrival` " + text)};
  if (a.rate <= 0 || a.rate > 1e9)
    throw ConfigError(fmt::format("`arrival` {}: the rate must be in (0, 1e9] requests/s", text));
  return a;
}

std::vector<Request> make_workload(int n, const Arrival& arrival, const LengthDist& prompt,
                                   const LengthDist& output, uint64_t seed, int shared_prefix) {
  const uint64_t gaps = model::stream_key(seed, "serve.arrival");
  const uint64_t prompts = model::stream_key(seed, "serve.prompt_len");
  const uint64_t outputs = model::stream_key(seed, "serve.output_len");
  std::vector<Request> out(static_cast<size_t>(n));
  double t = 0;
  for (int i = 0; i < n; ++i) {
    if (arrival.kind == Arrival::Kind::kPoisson && i > 0)
      t += -std::log(model::uniform_at(gaps, uint64_t(i))) / arrival.rate;
    if (t > kMaxArrivalS)
      throw ConfigError(fmt::format("`arrival` poisson:{:g}: request {} would arrive at {:.3g} s, after the last "
                                    "arrival a run may have ({:g} s): raise the rate or send fewer requests",
                                    arrival.rate, i, t, kMaxArrivalS));
    out[size_t(i)] = {i, t, shared_prefix + sample(prompt, prompts, uint64_t(i)), sample(output, outputs, uint64_t(i))};
    if (shared_prefix > 0) {
      out[size_t(i)].prefix_id = 0;
      out[size_t(i)].prefix_len = shared_prefix;
    }
  }
  return out;
}

namespace {

// Keys of shared prefixes and of a request's own tokens: apart from each
// other and from token ids (below 2^30).
uint64_t synthetic_key(bool shared, int owner, int t) {
  return (uint64_t(shared ? 2 : 3) << 62) | (uint64_t(uint32_t(owner)) << 31) | uint64_t(t);
}

}  // namespace

uint64_t content_key(const Request& r, std::span<const model::Token> ids, int64_t t) {
  if (!r.prompt.empty()) return uint64_t(ids[size_t(t)]);
  return t < r.prefix_len ? synthetic_key(true, r.prefix_id, int(t)) : synthetic_key(false, r.id, int(t));
}

std::vector<uint64_t> content_keys(const Request& r) {
  std::vector<uint64_t> keys(size_t(r.prompt_len));
  for (int t = 0; t < r.prompt_len; ++t) keys[size_t(t)] = content_key(r, r.prompt, t);
  return keys;
}

void draw_prompts(std::vector<Request>& requests, int vocab, uint64_t seed) {
  SHARDLAB_CHECK(vocab > 0, "a vocabulary needs a token");
  const uint64_t key = model::stream_key(seed, "serve.prompt_tokens");
  const uint64_t shared = model::stream_key(seed, "serve.prefix_tokens");
  for (Request& r : requests) {
    if (!r.prompt.empty()) continue;
    for (int j = 0; j < r.prompt_len; ++j) {
      const bool in_prefix = j < r.prefix_len;
      const uint64_t owner = uint64_t(uint32_t(in_prefix ? r.prefix_id : r.id));
      r.prompt.push_back(model::Token(model::random_bits(in_prefix ? shared : key, (owner << 32) | uint64_t(j)) % uint64_t(vocab)));
    }
  }
}

namespace {

// "3 17 42": the prompt's token ids, separated by spaces, as many as prompt_len.
std::vector<model::Token> prompt_ids(const std::string& text, int prompt_len, const std::string& where) {
  std::vector<model::Token> ids;
  std::stringstream in(text);
  for (std::string id; in >> id;) {
    const double v = number(id, where + ": prompt_tokens");
    if (v != std::floor(v) || v < 0 || v >= double(1 << 30))
      throw ConfigError(fmt::format("{}: prompt_tokens: '{}' is not a token id", where, id));
    ids.push_back(model::Token(v));
  }
  if (ids.size() != size_t(prompt_len))
    throw ConfigError(fmt::format("{}: prompt_tokens has {} ids, prompt_len says {}", where, ids.size(), prompt_len));
  return ids;
}

}  // namespace

namespace {

// The columns after arrival_s,prompt_len,output_len the header names.
enum class Extra { kNone, kPromptTokens, kPrefix };

Extra extra_columns(const std::string& line, const std::string& path) {
  const std::string header = "arrival_s,prompt_len,output_len";
  if (line == header) return Extra::kNone;
  if (line == header + ",prompt_tokens") return Extra::kPromptTokens;
  if (line == header + ",prefix_id,prefix_len") return Extra::kPrefix;
  throw ConfigError(fmt::format("`workload` {}: line 1 must be {}[,prompt_tokens] or {},prefix_id,prefix_len", path,
                                header, header));
}

void read_prefix(Request& r, const std::string& id, const std::string& len, const std::string& where) {
  const double v = number(id, where + ": prefix_id");
  if (v != std::floor(v) || v < -1 || v >= double(1 << 30))
    throw ConfigError(fmt::format("{}: prefix_id '{}' must be an integer in [-1, 2^30)", where, id));
  r.prefix_id = int(v);
  r.prefix_len = r.prefix_id < 0 ? 0 : length(len, where + ": prefix_len");
  if (r.prefix_id < 0 && number(len, where + ": prefix_len") != 0)
    throw ConfigError(fmt::format("{}: prefix_id -1 shares nothing: prefix_len must be 0", where));
  if (r.prefix_len > r.prompt_len)
    throw ConfigError(fmt::format("{}: prefix_len {} exceeds prompt_len {}", where, r.prefix_len, r.prompt_len));
}

}  // namespace

std::vector<Request> load_trace(const std::string& path) {
  std::ifstream in = open_input(fmt::format("`workload` {}", path), path, "a CSV file");
  std::string line;
  if (!std::getline(in, line)) line.clear();
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const Extra extra = extra_columns(line, path);
  const size_t fields = extra == Extra::kNone ? 3 : extra == Extra::kPromptTokens ? 4 : 5;
  std::vector<Request> out;
  for (int no = 2; std::getline(in, line); ++no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = fmt::format("`workload` {} line {}", path, no);
    const std::vector<std::string> f = split<std::string>(line, ',');
    if (f.size() != fields) throw ConfigError(fmt::format("{}: expected {} comma-separated fields", where, fields));
    Request r{static_cast<int>(out.size()), number(f[0], where), length(f[1], where), length(f[2], where), {}};
    if (r.arrival_s < 0 || (!out.empty() && r.arrival_s < out.back().arrival_s))
      throw ConfigError(where + ": arrivals must be non-negative and not decrease");
    if (r.arrival_s > kMaxArrivalS)
      throw ConfigError(fmt::format("{}: arrival {:g} s is after the last a run may have ({:g} s)", where, r.arrival_s,
                                    kMaxArrivalS));
    if (extra == Extra::kPromptTokens) r.prompt = prompt_ids(f[3], r.prompt_len, where);
    if (extra == Extra::kPrefix) read_prefix(r, f[3], f[4], where);
    out.push_back(r);
  }
  if (out.empty()) throw ConfigError(fmt::format("`workload` {}: no requests", path));
  return out;
}

}  // namespace shardlab::serve
