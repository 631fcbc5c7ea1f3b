#include "naive_gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

namespace shardlab::model::testing {
namespace {

using Rows = std::vector<std::vector<double>>;  // [row][feature]

std::string h(int l, const std::string& s) {
  return "transformer.h." + std::to_string(l) + "." + s;
}

Rows linear(const Rows& x, const double* w, const double* b, int out) {
  Rows y(x.size(), std::vector<double>(out, 0.0));
  const size_t in = x[0].size();
  for (size_t n = 0; n < x.size(); ++n) {
    for (int o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (size_t i = 0; i < in; ++i) s += x[n][i] * w[o * in + i];
      y[n][o] = s;
    }
  }
  return y;
}

Rows layernorm(const Rows& x, const double* w, const double* b) {
  Rows y = x;
  for (auto& row : y) {
    const double C = static_cast<double>(row.size());
    const double mean = std::accumulate(row.begin(), row.end(), 0.0) / C;
    double var = 0;
    for (double v : row) var += (v - mean) * (v - mean);
    var /= C;
    for (size_t c = 0; c < row.size(); ++c)
      row[c] = (row[c] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c];
  }
  return y;
}

double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

std::vector<double> softmax(std::vector<double> z) {
  const double m = *std::max_element(z.begin(), z.end());
  double s = 0;
  for (double& v : z) s += (v = std::exp(v - m));
  for (double& v : z) v /= s;
  return z;
}

Rows attention(const Rows& qkv, int B, int T, int NH) {
  const int C = static_cast<int>(qkv[0].size()) / 3, HS = C / NH;
  Rows y(qkv.size(), std::vector<double>(C, 0.0));
  for (int b = 0; b < B; ++b)
    for (int hd = 0; hd < NH; ++hd)
      for (int t = 0; t < T; ++t) {
        const auto& q = qkv[b * T + t];
        std::vector<double> s(t + 1);
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < HS; ++i) d += q[hd * HS + i] * qkv[b * T + u][C + hd * HS + i];
          s[u] = d / std::sqrt(static_cast<double>(HS));
        }
        s = softmax(s);
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < HS; ++i)
            y[b * T + t][hd * HS + i] += s[u] * qkv[b * T + u][2 * C + hd * HS + i];
      }
  return y;
}

Rows mlp(const Rows& x, const ParamLookup& p, const std::string& prefix, int C) {
  Rows a = linear(x, p(prefix + ".c_fc.weight"), p(prefix + ".c_fc.bias"), 4 * C);
  for (auto& row : a)
    for (double& v : row) v = gelu(v);
  return linear(a, p(prefix + ".c_proj.weight"), p(prefix + ".c_proj.bias"), C);
}

Rows moe(const Rows& x, const ParamLookup& p, int l, const GPTConfig& cfg, double* aux) {
  const int N = static_cast<int>(x.size()), C = cfg.n_embd, E = cfg.n_expert, K = cfg.top_k;
  const Rows logits = linear(x, p(h(l, "mlp.router.weight")), nullptr, E);
  const double cap = cfg.capacity_factor > 0 ? std::ceil(cfg.capacity_factor * N * K / E) : 1e300;
  std::vector<double> count(E, 0), pmean(E, 0);
  Rows y(N, std::vector<double>(C, 0.0));
  for (int n = 0; n < N; ++n) {
    const std::vector<double> pr = softmax(logits[n]);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[a] > pr[b]; });
    double denom = 0;
    for (int k = 0; k < K; ++k) denom += pr[order[k]];
    for (int k = 0; k < K; ++k) {
      const int e = order[k];
      if (count[e]++ >= cap) continue;  // dropped
      const Rows ye = mlp({x[n]}, p, h(l, "mlp.experts." + std::to_string(e)), C);
      for (int c = 0; c < C; ++c) y[n][c] += pr[e] / denom * ye[0][c];
    }
    for (int e = 0; e < E; ++e) pmean[e] += pr[e] / N;
  }
  *aux = 0;
  for (int e = 0; e < E; ++e) *aux += E * (count[e] / (static_cast<double>(N) * K)) * pmean[e];
  return y;
}

}  // namespace

namespace {

Rows rmsnorm(const Rows& x, const double* w, double eps) {
  Rows y = x;
  for (auto& row : y) {
    double ss = 0;
    for (double v : row) ss += v * v;
    const double r = 1 / std::sqrt(ss / static_cast<double>(row.size()) + eps);
    for (size_t c = 0; c < row.size(); ++c) row[c] *= r * w[c];
  }
  return y;
}

// Rotate-half RoPE of every head of `x` (heads of HS features) at position t.
void rope(std::vector<double>& x, int heads, int HS, int t, double theta) {
  const int half = HS / 2;
  for (int hd = 0; hd < heads; ++hd)
    for (int i = 0; i < half; ++i) {
      const double a = t * std::pow(theta, -2.0 * i / HS);
      double& x1 = x[hd * HS + i];
      double& x2 = x[hd * HS + i + half];
      const double r1 = x1 * std::cos(a) - x2 * std::sin(a), r2 = x2 * std::cos(a) + x1 * std::sin(a);
      x1 = r1, x2 = r2;
    }
}

std::string ll(int l, const std::string& s) { return "model.layers." + std::to_string(l) + "." + s; }

// DeepSeek-V3's attention (Hugging Face's DeepseekV3Attention, its RoPE
// rotate-half as the rest of this file's): q from q_a_proj, q_a_layernorm
// and q_b_proj (or q_proj), per head [nope | rope]; kv_a_proj_with_mqa to
// [latent | k_pe], the latent normalized and up-projected by kv_b_proj to
// per head [k_nope | v]; k_pe rotated once and shared by every head; scores
// over nope + rope features scaled by 1/sqrt(their count); o_proj.
Rows naive_mla(const GPTConfig& cfg, const ParamLookup& p, int l, const Rows& a, int B, int T) {
  const int N = B * T, NH = cfg.n_head, Dn = cfg.head_size(), Dr = cfg.qk_rope_head_dim, Dv = cfg.v_head_size();
  const int Dq = Dn + Dr, Lq = cfg.q_lora_rank, Lkv = cfg.kv_lora_rank, C = cfg.n_embd;
  Rows q;
  if (Lq > 0) {
    const Rows cq = rmsnorm(linear(a, p(ll(l, "self_attn.q_a_proj.weight")), nullptr, Lq),
                            p(ll(l, "self_attn.q_a_layernorm.weight")), cfg.norm_eps);
    q = linear(cq, p(ll(l, "self_attn.q_b_proj.weight")), nullptr, NH * Dq);
  } else {
    q = linear(a, p(ll(l, "self_attn.q_proj.weight")), nullptr, NH * Dq);
  }
  const Rows ckv = linear(a, p(ll(l, "self_attn.kv_a_proj_with_mqa.weight")), nullptr, Lkv + Dr);
  Rows latent(N), kpe(N);
  for (int n = 0; n < N; ++n) {
    latent[n].assign(ckv[n].begin(), ckv[n].begin() + Lkv);
    kpe[n].assign(ckv[n].begin() + Lkv, ckv[n].end());
  }
  const Rows kv = linear(rmsnorm(latent, p(ll(l, "self_attn.kv_a_layernorm.weight")), cfg.norm_eps),
                         p(ll(l, "self_attn.kv_b_proj.weight")), nullptr, NH * (Dn + Dv));
  for (int n = 0; n < N; ++n) {
    rope(kpe[n], 1, Dr, n % T, cfg.rope_theta);
    for (int hd = 0; hd < NH; ++hd) {
      std::vector<double> pe(q[n].begin() + hd * Dq + Dn, q[n].begin() + (hd + 1) * Dq);
      rope(pe, 1, Dr, n % T, cfg.rope_theta);
      std::copy(pe.begin(), pe.end(), q[n].begin() + hd * Dq + Dn);
    }
  }
  Rows y(N, std::vector<double>(NH * Dv, 0.0));
  for (int b = 0; b < B; ++b)
    for (int hd = 0; hd < NH; ++hd)
      for (int t = 0; t < T; ++t) {
        const std::vector<double>& qt = q[b * T + t];
        std::vector<double> s(t + 1);
        for (int u = 0; u <= t; ++u) {
          const std::vector<double>& ku = kv[b * T + u];
          double d = 0;
          for (int i = 0; i < Dn; ++i) d += qt[hd * Dq + i] * ku[hd * (Dn + Dv) + i];
          for (int i = 0; i < Dr; ++i) d += qt[hd * Dq + Dn + i] * kpe[b * T + u][i];
          s[u] = d / std::sqrt(static_cast<double>(Dq));
        }
        s = softmax(s);
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < Dv; ++i) y[b * T + t][hd * Dv + i] += s[u] * kv[b * T + u][hd * (Dn + Dv) + Dn + i];
      }
  return linear(y, p(ll(l, "self_attn.o_proj.weight")), nullptr, C);
}

}  // namespace

NaiveResult naive_llama_forward(const GPTConfig& cfg, const ParamLookup& p, const std::vector<Token>& inputs,
                                const std::vector<Token>& targets, int B, int T) {
  const int C = cfg.n_embd, V = cfg.vocab_size, N = B * T, NH = cfg.n_head, KV = cfg.kv_heads();
  const int HS = cfg.head_size(), F = cfg.ffn_hidden(), group = NH / KV;
  Rows x(N, std::vector<double>(C));
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) x[n][c] = p("model.embed_tokens.weight")[inputs[n] * C + c];
  for (int l = 0; l < cfg.n_layer; ++l) {
    const Rows a = rmsnorm(x, p(ll(l, "input_layernorm.weight")), cfg.norm_eps);
    if (cfg.is_mla()) {
      const Rows o = naive_mla(cfg, p, l, a, B, T);
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) x[n][c] += o[n][c];
    } else {
    Rows q = linear(a, p(ll(l, "self_attn.q_proj.weight")), nullptr, NH * HS);
    Rows k = linear(a, p(ll(l, "self_attn.k_proj.weight")), nullptr, KV * HS);
    const Rows v = linear(a, p(ll(l, "self_attn.v_proj.weight")), nullptr, KV * HS);
    if (cfg.qk_norm)  // Qwen3: RMSNorm over each head of q and of k, before RoPE
      for (int n = 0; n < N; ++n)
        for (auto [row, heads, w] : {std::tuple{&q[n], NH, p(ll(l, "self_attn.q_norm.weight"))},
                                     std::tuple{&k[n], KV, p(ll(l, "self_attn.k_norm.weight"))}})
          for (int hd = 0; hd < heads; ++hd) {
            const Rows head{std::vector<double>(row->begin() + hd * HS, row->begin() + (hd + 1) * HS)};
            const Rows y = rmsnorm(head, w, cfg.norm_eps);
            std::copy(y[0].begin(), y[0].end(), row->begin() + hd * HS);
          }
    for (int n = 0; n < N; ++n) {
      rope(q[n], NH, HS, n % T, cfg.rope_theta);
      rope(k[n], KV, HS, n % T, cfg.rope_theta);
    }
    Rows y(N, std::vector<double>(NH * HS, 0.0));
    for (int b = 0; b < B; ++b)
      for (int hd = 0; hd < NH; ++hd)
        for (int t = 0; t < T; ++t) {
          const int kvh = hd / group;
          std::vector<double> s(t + 1);
          for (int u = 0; u <= t; ++u) {
            double d = 0;
            for (int i = 0; i < HS; ++i) d += q[b * T + t][hd * HS + i] * k[b * T + u][kvh * HS + i];
            s[u] = d / std::sqrt(static_cast<double>(HS));
          }
          s = softmax(s);
          for (int u = 0; u <= t; ++u)
            for (int i = 0; i < HS; ++i) y[b * T + t][hd * HS + i] += s[u] * v[b * T + u][kvh * HS + i];
        }
    const Rows o = linear(y, p(ll(l, "self_attn.o_proj.weight")), nullptr, C);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) x[n][c] += o[n][c];
    }
    const Rows m = rmsnorm(x, p(ll(l, "post_attention_layernorm.weight")), cfg.norm_eps);
    const Rows gate = linear(m, p(ll(l, "mlp.gate_proj.weight")), nullptr, F);
    Rows up = linear(m, p(ll(l, "mlp.up_proj.weight")), nullptr, F);
    for (int n = 0; n < N; ++n)
      for (int f = 0; f < F; ++f) up[n][f] *= gate[n][f] / (1 + std::exp(-gate[n][f]));  // silu(gate) · up
    const Rows down = linear(up, p(ll(l, "mlp.down_proj.weight")), nullptr, C);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) x[n][c] += down[n][c];
  }
  const Rows lnf = rmsnorm(x, p("model.norm.weight"), cfg.norm_eps);
  const Rows logits = linear(lnf, p(cfg.tied() ? "model.embed_tokens.weight" : "lm_head.weight"), nullptr, V);
  NaiveResult r;
  for (int n = 0; n < N; ++n) {
    const std::vector<double> pr = softmax(logits[n]);
    r.ce -= std::log(pr[targets[n]]) / N;
    r.logits.insert(r.logits.end(), logits[n].begin(), logits[n].end());
  }
  r.loss = r.ce;
  return r;
}

NaiveResult naive_gpt_forward(const GPTConfig& cfg, const ParamLookup& p,
                              const std::vector<Token>& inputs, const std::vector<Token>& targets,
                              int B, int T) {
  const int C = cfg.n_embd, V = cfg.vocab_size, N = B * T;
  Rows x(N, std::vector<double>(C));
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      x[n][c] = p("transformer.wte.weight")[inputs[n] * C + c] +
                p("transformer.wpe.weight")[(n % T) * C + c];
  NaiveResult r;
  for (int l = 0; l < cfg.n_layer; ++l) {
    const Rows a = layernorm(x, p(h(l, "ln_1.weight")), p(h(l, "ln_1.bias")));
    const Rows qkv = linear(a, p(h(l, "attn.c_attn.weight")), p(h(l, "attn.c_attn.bias")), 3 * C);
    const Rows att = linear(attention(qkv, B, T, cfg.n_head), p(h(l, "attn.c_proj.weight")),
                            p(h(l, "attn.c_proj.bias")), C);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) x[n][c] += att[n][c];
    const Rows m = layernorm(x, p(h(l, "ln_2.weight")), p(h(l, "ln_2.bias")));
    double aux = 0;
    const Rows f = cfg.is_moe_layer(l) ? moe(m, p, l, cfg, &aux) : mlp(m, p, h(l, "mlp"), C);
    r.aux += aux;
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) x[n][c] += f[n][c];
  }
  const Rows lnf = layernorm(x, p("transformer.ln_f.weight"), p("transformer.ln_f.bias"));
  const Rows logits = linear(lnf, p("transformer.wte.weight"), nullptr, V);
  for (int n = 0; n < N; ++n) {
    const std::vector<double> pr = softmax(logits[n]);
    r.ce -= std::log(pr[targets[n]]) / N;
    r.logits.insert(r.logits.end(), logits[n].begin(), logits[n].end());
  }
  r.loss = r.ce + cfg.aux_coef * r.aux;
  return r;
}

}  // namespace shardlab::model::testing
