// Helpers shared by the reference model's tests: random configs and prompts, an independent
// forward pass (plain loops, double precision, one prompt, from the semantic weights), cache
// comparisons, and the GEMM backends this build can run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.hpp"
#include "prepack/reference.hpp"

namespace test {

namespace ref = prepack::reference;

// Every backend this build has: Eigen always, oneDNN when configured with it.
inline std::vector<ref::gemm_backend> backends() {
  std::vector<ref::gemm_backend> b{ref::gemm_backend::eigen};
  if (ref::onednn_available()) b.push_back(ref::gemm_backend::onednn);
  return b;
}

// ---- an independent forward pass: plain loops, double precision, one prompt ----

struct naive_result {
  std::vector<std::vector<double>> k, v;  // [layer][position * kv_dim + head * head_dim + d]
  std::vector<double> logits;             // [vocab]
};

// Runs f(threads) with OpenMP's thread count set to each of `counts` in turn, and gives the
// caller's count back afterwards (also when an assertion in f returns early).
template <class F>
void for_threads(std::initializer_list<int> counts, F&& f) {
#ifdef _OPENMP
  struct restore {
    int n;
    ~restore() { omp_set_num_threads(n); }
  } keep{omp_get_max_threads()};
#endif
  for (const int threads : counts) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    f(threads);
  }
}

inline std::vector<double> naive_norm(const std::vector<double>& x, const ref::vector& w,
                                      double eps) {
  double ms = 0;
  for (double e : x) ms += e * e;
  ms /= static_cast<double>(x.size());
  std::vector<double> out(x.size());
  for (std::size_t j = 0; j < x.size(); ++j)
    out[j] = x[j] / std::sqrt(ms + eps) * w[static_cast<Eigen::Index>(j)];
  return out;
}

// y = x w + b, w [in][out].
inline std::vector<double> naive_linear(const std::vector<double>& x, const ref::matrix& w,
                                        const ref::vector& b = ref::vector()) {
  std::vector<double> out(static_cast<std::size_t>(w.cols()), 0.0);
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    for (Eigen::Index j = 0; j < w.cols(); ++j)
      out[static_cast<std::size_t>(j)] += x[static_cast<std::size_t>(i)] * w(i, j);
  }
  for (Eigen::Index j = 0; j < b.size(); ++j) out[static_cast<std::size_t>(j)] += b[j];
  return out;
}

// Rotate-half RoPE; frequency i divided by factors[i] when given (scaled RoPE).
inline void naive_rope(double* x, int head_dim, int pos, double theta,
                       const std::vector<double>& factors) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double f = factors.empty() ? 1.0 : factors[static_cast<std::size_t>(i)];
    const double a = pos * std::pow(theta, -2.0 * i / (2 * half)) / f;
    const double x1 = x[i], x2 = x[i + half];
    x[i] = x1 * std::cos(a) - x2 * std::sin(a);
    x[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
  }
}

inline naive_result naive_prefill(const ref::config& c, const ref::weights& w,
                                  const std::vector<int>& tokens) {
  const std::size_t n = tokens.size();
  const int hd = c.head_size(), group = c.n_heads / c.n_kv_heads;
  std::vector<std::vector<double>> h(n, std::vector<double>(static_cast<std::size_t>(c.hidden)));
  for (std::size_t t = 0; t < n; ++t) {
    for (int j = 0; j < c.hidden; ++j) h[t][static_cast<std::size_t>(j)] = w.embed(tokens[t], j);
  }
  naive_result out;
  for (const ref::layer_weights& lw : w.layers) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (std::size_t t = 0; t < n; ++t) {
      const auto x = naive_norm(h[t], lw.attn_norm, c.rms_eps);
      q[t] = naive_linear(x, lw.wq, lw.bq);
      k[t] = naive_linear(x, lw.wk, lw.bk);
      v[t] = naive_linear(x, lw.wv, lw.bv);
      // Qwen3's per-head norms: each head of Q and K RMS-normalised over its head_dim.
      const auto head_norm = [&](std::vector<double>& y, int head, const ref::vector& nw) {
        std::vector<double> one(y.begin() + head * hd, y.begin() + (head + 1) * hd);
        one = naive_norm(one, nw, c.rms_eps);
        std::copy(one.begin(), one.end(), y.begin() + head * hd);
      };
      for (int a = 0; a < c.n_heads; ++a) {
        if (c.qk_norm) head_norm(q[t], a, lw.q_norm);
        naive_rope(q[t].data() + a * hd, hd, static_cast<int>(t), c.rope_theta,
                   c.rope_freq_factors);
      }
      for (int g = 0; g < c.n_kv_heads; ++g) {
        if (c.qk_norm) head_norm(k[t], g, lw.k_norm);
        naive_rope(k[t].data() + g * hd, hd, static_cast<int>(t), c.rope_theta,
                   c.rope_freq_factors);
      }
    }
    std::vector<double> kflat, vflat;
    for (std::size_t t = 0; t < n; ++t) {
      kflat.insert(kflat.end(), k[t].begin(), k[t].end());
      vflat.insert(vflat.end(), v[t].begin(), v[t].end());
    }
    out.k.push_back(kflat);
    out.v.push_back(vflat);
    for (std::size_t t = 0; t < n; ++t) {
      std::vector<double> att(static_cast<std::size_t>(c.q_dim()), 0.0);
      for (int a = 0; a < c.n_heads; ++a) {
        const int g = a / group;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (std::size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d)
            dot += q[t][static_cast<std::size_t>(a * hd + d)] *
                   k[j][static_cast<std::size_t>(g * hd + d)];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (std::size_t j = 0; j <= t; ++j) {
          for (int d = 0; d < hd; ++d)
            att[static_cast<std::size_t>(a * hd + d)] +=
                s[j] / sum * v[j][static_cast<std::size_t>(g * hd + d)];
        }
      }
      const auto o = naive_linear(att, lw.wo);
      for (std::size_t j = 0; j < o.size(); ++j) h[t][j] += o[j];
      const auto x = naive_norm(h[t], lw.mlp_norm, c.rms_eps);
      auto gate = naive_linear(x, lw.w_gate);
      const auto up = naive_linear(x, lw.w_up);
      for (std::size_t j = 0; j < gate.size(); ++j)
        gate[j] = gate[j] / (1.0 + std::exp(-gate[j])) * up[j];
      const auto dn = naive_linear(gate, lw.w_down);
      for (std::size_t j = 0; j < dn.size(); ++j) h[t][j] += dn[j];
    }
  }
  const auto last = naive_norm(h[n - 1], w.final_norm, c.rms_eps);
  if (c.tied_embeddings) {
    out.logits = naive_linear(last, w.embed.transpose());
  } else {
    out.logits = naive_linear(last, w.lm_head);
  }
  return out;
}

// ---- random models and prompt sets ----

inline ref::config random_config(std::mt19937_64& rng) {
  ref::config c;
  const int kv[] = {1, 2, 3}, grp[] = {1, 2, 4}, hds[] = {3, 4, 5, 7, 8, 16};
  c.n_kv_heads = kv[rng() % 3];
  c.n_heads = c.n_kv_heads * grp[rng() % 3];
  c.head_dim = hds[rng() % 6];
  c.hidden = 8 + static_cast<int>(rng() % 48);
  c.ffn = 8 + static_cast<int>(rng() % 80);
  c.n_layers = 1 + static_cast<int>(rng() % 4);
  c.vocab = 32 + static_cast<int>(rng() % 200);
  c.rope_theta = rng() % 2 ? 10000.0 : 500000.0;
  c.pad_id = static_cast<int>(rng() % static_cast<std::uint64_t>(c.vocab));
  c.qkv_bias = rng() % 3 == 0;
  c.tied_embeddings = rng() % 3 == 0;
  c.qk_norm = rng() % 3 == 0;
  if (rng() % 3 == 0) {  // scaled RoPE: a divisor per frequency
    for (int i = 0; i < c.rotary_dim() / 2; ++i) {
      c.rope_freq_factors.push_back(1.0 + static_cast<double>(rng() % 1000) / 100.0);
    }
  }
  return c;
}

inline std::vector<int> random_prompt_lengths(std::mt19937_64& rng, int kind) {
  switch (kind % 4) {
    case 0:
      return test::random_lengths(rng, 4 + rng() % 12, 1, 300);  // uniform 1..300
    case 1:
      return std::vector<int>(6, 1 + static_cast<int>(rng() % 120));  // all equal
    case 2: {                                                         // one long, many short
      auto len = test::random_lengths(rng, 16, 1, 12);
      len[rng() % len.size()] = 250 + static_cast<int>(rng() % 51);
      return len;
    }
    default:
      return test::heavy_tailed_lengths(rng, 12, 200);
  }
}

inline std::vector<std::vector<int>> random_prompts(std::mt19937_64& rng,
                                                    const std::vector<int>& len, int vocab) {
  std::vector<std::vector<int>> p(len.size());
  for (std::size_t i = 0; i < len.size(); ++i) {
    for (int t = 0; t < len[i]; ++t)
      p[i].push_back(static_cast<int>(rng() % static_cast<std::uint64_t>(vocab)));
  }
  return p;
}

inline std::vector<int> lengths_of(const std::vector<std::vector<int>>& prompts) {
  std::vector<int> len;
  for (const auto& p : prompts) len.push_back(static_cast<int>(p.size()));
  return len;
}

// Largest |a - b| over every prompt's keys and values (cached positions) and logits.
struct diff {
  double kv = 0, logits = 0;
};

inline diff compare(const ref::paged_cache& a, const ref::matrix& la, const ref::paged_cache& b,
                    const ref::matrix& lb) {
  diff d;
  d.kv = ref::max_abs_diff(a, b);
  d.logits = (la - lb).cwiseAbs().maxCoeff();
  return d;
}

// Greedy continuations agree, unless the reference itself was at a near-tie where they split.
inline void expect_same_tokens(const ref::decode_result& want, const ref::decode_result& got,
                               const std::string& what, float tie = 1e-3f) {
  ASSERT_EQ(want.tokens.size(), got.tokens.size()) << what;
  for (std::size_t i = 0; i < want.tokens.size(); ++i) {
    for (std::size_t k = 0; k < want.tokens[i].size(); ++k) {
      if (want.tokens[i][k] == got.tokens[i][k]) continue;
      EXPECT_LT(want.margins[i][k], tie)
          << what << ": prompt " << i << " token " << k << " differs with a clear margin";
      break;  // after a legitimate near-tie split the continuations may differ
    }
  }
}

}  // namespace test
