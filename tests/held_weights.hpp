// Models whose weights are held quantized (reference::quantized_matrix), built in memory for
// the invariant tests: every projection's, the embedding's and the LM head's rows in ggml's Q8_0
// (as llama.cpp's quantize_row_q8_0_ref encodes them) where its input width is whole 32-value
// blocks, else as F32 rows, so any config runs through the held path (segments, the norm on the
// input, panels decoded inside the GEMM).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "prepack/numeric.hpp"
#include "prepack/reference/model.hpp"

namespace test {

namespace ref = prepack::reference;

// n values (a multiple of 32) as Q8_0 blocks: an fp16 scale amax / 127, then 32 int8 values.
inline std::vector<unsigned char> q8_0_bytes(const float* v, std::size_t n) {
  std::vector<unsigned char> out;
  out.reserve(n / 32 * 34);
  for (std::size_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (std::size_t k = 0; k < 32; ++k) amax = std::max(amax, std::abs(v[b + k]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const std::uint16_t h = prepack::half::from_float(d);
    out.push_back(static_cast<unsigned char>(h & 0xFF));
    out.push_back(static_cast<unsigned char>(h >> 8));
    for (std::size_t k = 0; k < 32; ++k) {
      const auto q = static_cast<std::int8_t>(std::round(v[b + k] * id));
      out.push_back(static_cast<unsigned char>(q));
    }
  }
  return out;
}

// A semantic [in][out] projection as held rows: Q8_0 where `in` is whole blocks, else F32.
inline ref::quantized_matrix held_rows(const ref::matrix& in_out) {
  if (in_out.rows() % 32 != 0) return ref::quantized_matrix::from_fp32(in_out);
  const ref::matrix rows = in_out.transpose();  // [out][in]
  const auto bytes = q8_0_bytes(rows.data(), static_cast<std::size_t>(rows.size()));
  return ref::quantized_matrix::from_bytes(prepack::checkpoint::ggml_type::q8_0, rows.rows(),
                                           rows.cols(), bytes.data(), bytes.size(), "test");
}

// w with every projection moved into layer_weights::quantized.
inline ref::weights held_quantized(ref::weights w) {
  for (ref::layer_weights& lw : w.layers) {
    ref::quantized_projections& q = lw.quantized;
    const auto move = [](ref::matrix& m, ref::quantized_matrix& qm) {
      qm = held_rows(m);
      m = ref::matrix();
    };
    move(lw.wq, q.wq);
    move(lw.wk, q.wk);
    move(lw.wv, q.wv);
    move(lw.wo, q.wo);
    move(lw.w_gate, q.w_gate);
    move(lw.w_up, q.w_up);
    move(lw.w_down, q.w_down);
  }
  return w;
}

// Weights handed over as a checkpoint that holds everything quantized would: projections,
// embedding and (untied) LM head as rows (Q8_0 where their width is whole blocks, else F32).
class held_source final : public ref::weight_source {
 public:
  explicit held_source(ref::weights w) : w_(held_quantized(std::move(w))) {}
  ref::quantized_matrix embed_quantized() override {
    const ref::matrix t = w_.embed.transpose();  // [hidden][vocab]: rows of the table
    w_.embed = ref::matrix();
    return held_rows(t);
  }
  ref::quantized_matrix lm_head_quantized() override {
    ref::quantized_matrix q = held_rows(w_.lm_head);
    w_.lm_head = ref::matrix();
    return q;
  }
  ref::matrix embed() override { return std::move(w_.embed); }
  ref::layer_weights layer(int l) override {
    return std::move(w_.layers.at(static_cast<std::size_t>(l)));
  }
  ref::vector final_norm() override { return std::move(w_.final_norm); }
  ref::matrix lm_head() override { return std::move(w_.lm_head); }

 private:
  ref::weights w_;
};

// The seeded model of config c (ref::random_weights) with every matrix held quantized.
inline ref::model held_model(const ref::config& c, std::uint64_t seed) {
  held_source src(ref::random_weights(c, seed));
  return ref::model(c, src);
}

}  // namespace test
