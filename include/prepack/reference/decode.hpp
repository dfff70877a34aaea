// prepack/reference/decode.hpp - per-prompt KV caches scattered out of a packed prefill with
// prepack's unpacker, and batched greedy decoding that continues every prompt from its cache.
//
// Cost of one decode step for B prompts: B * per-token linear FLOPs (GEMMs over the batch)
// plus, per prompt, attention over its cache. Caches are allocated once with room for the new
// tokens; decoding allocates only O(B * (hidden + ffn + vocab)) floats of activations.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout.hpp"
#include "../unpack.hpp"
#include "model.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// One prompt's KV cache, positions 0 .. length - 1 filled, room for capacity.
struct kv_cache {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  std::size_t capacity = 0;   // positions the buffers hold
  std::size_t length = 0;     // positions filled
  std::vector<float> keys;    // [n_layers][n_kv_heads][capacity][head_dim]  after RoPE
  std::vector<float> values;  // [n_layers][n_kv_heads][capacity][head_dim]

  kv_cache() = default;
  kv_cache(const config& c, std::size_t cap)
      : n_layers(c.n_layers),
        n_kv_heads(c.n_kv_heads),
        head_dim(c.head_size()),
        capacity(cap),
        keys(per_layer() * static_cast<std::size_t>(c.n_layers)),
        values(per_layer() * static_cast<std::size_t>(c.n_layers)) {}

  std::size_t per_layer() const noexcept {
    return static_cast<std::size_t>(n_kv_heads) * capacity * static_cast<std::size_t>(head_dim);
  }
  /// Layer l's keys / values as (position, head, dim).
  tensor_view<float, 3> key_view(int layer) { return view(keys, layer); }
  tensor_view<float, 3> value_view(int layer) { return view(values, layer); }
  /// Head h's key (value) of position p in layer l: head_dim contiguous floats.
  float* key(int layer, int head, std::size_t pos) {
    return keys.data() + offset(layer, head, pos);
  }
  float* value(int layer, int head, std::size_t pos) {
    return values.data() + offset(layer, head, pos);
  }
  const float* key(int layer, int head, std::size_t pos) const {
    return keys.data() + offset(layer, head, pos);
  }
  const float* value(int layer, int head, std::size_t pos) const {
    return values.data() + offset(layer, head, pos);
  }

 private:
  std::size_t offset(int layer, int head, std::size_t pos) const noexcept {
    return static_cast<std::size_t>(layer) * per_layer() +
           (static_cast<std::size_t>(head) * capacity + pos) * static_cast<std::size_t>(head_dim);
  }
  tensor_view<float, 3> view(std::vector<float>& kv, int layer) {
    return prompt_view(kv.data() + static_cast<std::size_t>(layer) * per_layer(),
                       cache_order::head_position_dim, capacity,
                       static_cast<std::size_t>(n_kv_heads), static_cast<std::size_t>(head_dim));
  }
};

/// Scatters a prefill's packed KV into one cache per prompt, each with room for `extra` more
/// positions, through prepack::unpack_prompts. Throws prepack::error if the result was not
/// computed over this layout (shapes differ) or by a model of another shape.
template <class Token, class Index>
std::vector<kv_cache> unpack_caches(const model& m, const packed_layout<Token, Index>& l,
                                    const prefill_result& r, std::size_t extra = 0) {
  const config& c = m.cfg();
  prepack::detail::require(
      r.n_layers == c.n_layers && r.n_kv_heads == c.n_kv_heads && r.head_dim == c.head_size(),
      "prefill result: ", r.n_layers, " layers x ", r.n_kv_heads, " kv heads x ", r.head_dim,
      " dims, the model has ", c.n_layers, " x ", c.n_kv_heads, " x ", c.head_size());
  prepack::detail::require(r.n_rows == l.n_rows() && r.width == l.width(), "prefill result: ", r.n_rows,
                           " rows x ", r.width, " slots, the layout has ", l.n_rows(), " x ", l.width(),
                           " (a layout from another batch?)");
  std::vector<kv_cache> caches;
  caches.reserve(l.n_prompts());
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    caches.emplace_back(c, static_cast<std::size_t>(l.prompt_length()[i]) + extra);
    caches.back().length = static_cast<std::size_t>(l.prompt_length()[i]);
  }
  std::vector<tensor_view<float, 3>> keys(l.n_prompts()), values(l.n_prompts());
  for (int layer = 0; layer < c.n_layers; ++layer) {
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      keys[i] = caches[i].key_view(layer);
      values[i] = caches[i].value_view(layer);
    }
    unpack_prompts(l, r.key_view(layer), keys);
    unpack_prompts(l, r.value_view(layer), values);
  }
  return caches;
}

struct decode_options {
  int n_threads = 0;  // 0: all the machine offers
};

/// Greedy continuations: tokens[i][k] is prompt i's k-th new token; margins[i][k] how far its
/// logit led the runner-up (a small margin marks a near-tie that rounding could flip).
struct decode_result {
  std::vector<std::vector<int>> tokens;     // [n_prompts][n_new]
  std::vector<std::vector<float>> margins;  // [n_prompts][n_new]
};

/// Continues every prompt greedily for n_new tokens: the first from `last_logits` (the
/// prefill's, [n_prompts][vocab]), each next one from a batched decode step over all prompts,
/// appending to the caches. Throws prepack::error, changing nothing, if the counts differ, a
/// cache belongs to a model of another shape or lacks room for n_new - 1 positions, or
/// n_new < 0.
inline decode_result greedy_decode(const model& m, std::vector<kv_cache>& caches,
                                   const matrix& last_logits, int n_new,
                                   const decode_options& opt = {}) {
  using prepack::detail::require;
  const config& c = m.cfg();
  const weights& w = m.params();
  const std::size_t b = caches.size();
  require(n_new >= 0, "n_new ", n_new);
  require(static_cast<std::size_t>(last_logits.rows()) == b && last_logits.cols() == c.vocab,
          "last_logits: ", last_logits.rows(), " x ", last_logits.cols(), " for ", b,
          " caches and vocab ", c.vocab);
  for (std::size_t i = 0; i < b; ++i) {
    const kv_cache& kc = caches[i];
    require(kc.n_layers == c.n_layers && kc.n_kv_heads == c.n_kv_heads &&
                kc.head_dim == c.head_size() &&
                kc.keys.size() == kc.per_layer() * static_cast<std::size_t>(c.n_layers) &&
                kc.values.size() == kc.keys.size(),
            "cache ", i, ": shape does not match the model");
    require(kc.length >= 1 && kc.length <= kc.capacity, "cache ", i, ": length ", kc.length,
            " with capacity ", kc.capacity);
    require(n_new == 0 || kc.length + static_cast<std::size_t>(n_new) - 1 <= kc.capacity, "cache ",
            i, ": capacity ", kc.capacity, " cannot hold ", n_new - 1, " more positions after ",
            kc.length);
  }
  decode_result out;
  out.tokens.assign(b, std::vector<int>());
  out.margins.assign(b, std::vector<float>());
  if (n_new == 0 || b == 0) return out;

  detail::thread_scope threads(opt.n_threads);
  const int nt = threads.n();
  const Eigen::Index hd = c.head_size();
  const int group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Eigen::Index bn = static_cast<Eigen::Index>(b);
  std::size_t longest = 0;
  for (const kv_cache& kc : caches)
    longest = std::max(longest, kc.length + static_cast<std::size_t>(n_new));
  const detail::rope_table rope =
      detail::make_rope_table(c.rotary_dim(), c.rope_theta, static_cast<std::int64_t>(longest));
  matrix h(bn, c.hidden), x(bn, c.hidden), q(bn, c.q_dim()), k(bn, c.kv_dim()), v(bn, c.kv_dim()),
      att(bn, c.q_dim()), gate(bn, c.ffn), up(bn, c.ffn), logits = last_logits;
  std::vector<float> scores(static_cast<std::size_t>(nt) * longest);  // [n_threads][longest]

  for (int step = 0;; ++step) {
    for (std::size_t i = 0; i < b; ++i) {
      const auto [token, margin] = detail::argmax_with_margin(
          logits.row(static_cast<Eigen::Index>(i)).data(), static_cast<std::size_t>(c.vocab));
      out.tokens[i].push_back(token);
      out.margins[i].push_back(margin);
      h.row(static_cast<Eigen::Index>(i)) = w.embed.row(token);
    }
    if (step + 1 == n_new) break;
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const layer_weights& lw = w.layers[static_cast<std::size_t>(layer)];
      detail::rms_norm(h, lw.attn_norm, c.rms_eps, x);
      q.noalias() = x * lw.wq;
      k.noalias() = x * lw.wk;
      v.noalias() = x * lw.wv;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
      for (Eigen::Index i = 0; i < bn; ++i) {
        kv_cache& kc = caches[static_cast<std::size_t>(i)];
        const std::size_t pos = kc.length;  // the new token's position
        float* s = scores.data() + static_cast<std::size_t>(detail::thread_id()) * longest;
        for (Eigen::Index g = 0; g < c.n_kv_heads; ++g) {
          float* kr = k.row(i).data() + g * hd;
          detail::rope(kr, rope, static_cast<std::int64_t>(pos));
          std::copy(kr, kr + hd, kc.key(layer, static_cast<int>(g), pos));
          std::copy(v.row(i).data() + g * hd, v.row(i).data() + (g + 1) * hd,
                    kc.value(layer, static_cast<int>(g), pos));
        }
        for (Eigen::Index head = 0; head < c.n_heads; ++head) {
          float* qh = q.row(i).data() + head * hd;
          detail::rope(qh, rope, static_cast<std::int64_t>(pos));
          const int g = static_cast<int>(head) / group;
          Eigen::Map<const matrix> keys(kc.key(layer, g, 0), static_cast<Eigen::Index>(pos + 1),
                                        hd);
          Eigen::Map<const matrix> vals(kc.value(layer, g, 0), static_cast<Eigen::Index>(pos + 1),
                                        hd);
          Eigen::Map<Eigen::VectorXf> sv(s, static_cast<Eigen::Index>(pos + 1));
          sv.noalias() = keys * Eigen::Map<const Eigen::VectorXf>(qh, hd);
          sv *= scale;
          detail::softmax(s, pos + 1);
          att.row(i).segment(head * hd, hd).noalias() = (vals.transpose() * sv).transpose();
        }
      }
      h.noalias() += att * lw.wo;
      detail::rms_norm(h, lw.mlp_norm, c.rms_eps, x);
      gate.noalias() = x * lw.w_gate;
      up.noalias() = x * lw.w_up;
      for (Eigen::Index i = 0; i < bn; ++i)
        detail::swiglu(gate.row(i).data(), up.row(i).data(), static_cast<std::size_t>(c.ffn));
      h.noalias() += gate * lw.w_down;
    }
    for (kv_cache& kc : caches) ++kc.length;
    detail::rms_norm(h, w.final_norm, c.rms_eps, x);
    logits.noalias() = x * w.lm_head;
  }
  return out;
}

/// Largest |a - b| over the filled positions of two sets of caches (e.g. prepacked vs alone).
/// Throws prepack::error if the sets differ in count, shape or lengths.
inline float max_abs_diff(const std::vector<kv_cache>& a, const std::vector<kv_cache>& b) {
  prepack::detail::require(a.size() == b.size(), "caches: ", a.size(), " vs ", b.size());
  float worst = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i) {
    prepack::detail::require(a[i].n_layers == b[i].n_layers && a[i].n_kv_heads == b[i].n_kv_heads &&
                                 a[i].head_dim == b[i].head_dim && a[i].length == b[i].length,
                             "cache ", i, ": shapes or lengths differ");
    for (int layer = 0; layer < a[i].n_layers; ++layer) {
      for (int g = 0; g < a[i].n_kv_heads; ++g) {
        const std::size_t n = a[i].length * static_cast<std::size_t>(a[i].head_dim);
        const float *ka = a[i].key(layer, g, 0), *kb = b[i].key(layer, g, 0);
        const float *va = a[i].value(layer, g, 0), *vb = b[i].value(layer, g, 0);
        for (std::size_t e = 0; e < n; ++e) {
          worst = std::max(worst, std::max(std::abs(ka[e] - kb[e]), std::abs(va[e] - vb[e])));
        }
      }
    }
  }
  return worst;
}

/// Prefills each prompt alone (a batch of one, no padding, no packing): the independent
/// computation prepacked and padded prefill must agree with. Returns the per-prompt caches and
/// logits [n_prompts][vocab].
template <class T>
std::pair<std::vector<kv_cache>, matrix> prefill_alone(const model& m,
                                                       const std::vector<std::vector<T>>& prompts,
                                                       std::size_t extra = 0,
                                                       const prefill_options& opt = {}) {
  std::vector<kv_cache> caches;
  matrix logits(static_cast<Eigen::Index>(prompts.size()), m.cfg().vocab);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    prepack::detail::require(!prompts[i].empty(), "prompt ", i, ": length 0");
    const std::vector<long long> len{static_cast<long long>(prompts[i].size())};
    const auto plan = first_fit_decreasing(len);
    const auto l = make_layout(plan, prompts[i], {m.cfg().pad_id, 0});
    const prefill_result r = m.prefill(l, opt);
    auto one = unpack_caches(m, l, r, extra);
    caches.push_back(std::move(one.front()));
    logits.row(static_cast<Eigen::Index>(i)) = r.logits.row(0);
  }
  return {std::move(caches), std::move(logits)};
}

}  // namespace reference
PREPACK_NAMESPACE_END
