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
                                   const LengthDist& output, uint64_t seed) {
  const uint64_t gaps = model::stream_key(seed, "serve.arrival");
  const uint64_t prompts = model::stream_key(seed, "serve.prompt_len");
  const uint64_t outputs = model::stream_key(seed, "serve.output_len");
  std::vector<Request> out(static_cast<size_t>(n));
  double t = 0;
  for (int i = 0; i < n; ++i) {
    if (arrival.kind == Arrival::Kind::kPoisson && i > 0)
      t += -std::log(model::uniform_at(gaps, uint64_t(i))) / arrival.rate;
    out[size_t(i)] = {i, t, sample(prompt, prompts, uint64_t(i)), sample(output, outputs, uint64_t(i))};
  }
  return out;
}

void draw_prompts(std::vector<Request>& requests, int vocab, uint64_t seed) {
  SHARDLAB_CHECK(vocab > 0, "a vocabulary needs a token");
  const uint64_t key = model::stream_key(seed, "serve.prompt_tokens");
  for (Request& r : requests) {
    if (!r.prompt.empty()) continue;
    for (int j = 0; j < r.prompt_len; ++j)
      r.prompt.push_back(model::Token(model::random_bits(key, (uint64_t(r.id) << 32) | uint64_t(j)) % uint64_t(vocab)));
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

std::vector<Request> load_trace(const std::string& path) {
  std::ifstream in = open_input(fmt::format("`workload` {}", path), path, "a CSV file");
  std::string line;
  const std::string header = "arrival_s,prompt_len,output_len";
  if (!std::getline(in, line)) line.clear();
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line != header && line != header + ",prompt_tokens")
    throw ConfigError(fmt::format("`workload` {}: line 1 must be {}[,prompt_tokens]", path, header));
  const size_t fields = line == header ? 3 : 4;
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
    if (fields == 4) r.prompt = prompt_ids(f[3], r.prompt_len, where);
    out.push_back(r);
  }
  if (out.empty()) throw ConfigError(fmt::format("`workload` {}: no requests", path));
  return out;
}

}  // namespace shardlab::serve
