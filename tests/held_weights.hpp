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

#include "prepack/reference/model.hpp"
#include "q8_0.hpp"

namespace test {

namespace ref = prepack::reference;

// A semantic [in][out] projection as held rows: Q8_0 where `in` is whole blocks, else F32.
inline ref::quantized_matrix held_rows(const ref::matrix& in_out) {
  if (in_out.rows() % 32 != 0) return ref::quantized_matrix::from_fp32(in_out);
  const ref::matrix rows = in_out.transpose();  // [out][in]
  const auto bytes = q8_0_bytes(rows.data(), static_cast<std::size_t>(rows.size()));
  return ref::quantized_matrix::from_bytes(prepack::ggml::ggml_type::q8_0, rows.rows(), rows.cols(),
                                           bytes.data(), bytes.size(), "test");
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

// c with hidden and ffn widths of whole 32-value blocks, so that its Q | K | V, gate | up, down
// and LM head rows are Q8_0 (held_rows) and dot 8-bit activations when asked to.
inline ref::config whole_blocks(ref::config c) {
  c.hidden = 64;
  c.ffn = 96;
  return c;
}

// How far a model's cache and logits may stray from running each request alone, and the logit
// margin under which greedy tokens may split: fp32 rounding, or with 8-bit activations a
// rounding step of some activation (an fp32 sum ordered otherwise, as a one-token step orders
// attention unlike a whole prefill, can put a value on the other side of a step: a change of
// d_b |w| in a dot, then carried forward; bit-equal where the orders agree, as packed
// prefills are).
struct slack {
  double kv = 1e-4, logits = 1e-3;
  float tie = 1e-3f;
};
inline slack slack_for(const ref::model& m) {
  return m.int8_activations() ? slack{0.1, 0.1, 0.1f} : slack{};
}

// The seeded model of config c (ref::random_weights) with every matrix held quantized, its
// layers dotting 8-bit activations with `int8` (model_options::activations; the layers of
// whole Q8_0 blocks).
inline ref::model held_model(const ref::config& c, std::uint64_t seed, bool int8 = false) {
  held_source src(ref::random_weights(c, seed));
  ref::model_options o;
  if (int8) o.activations = ref::activation_type::int8;
  return ref::model(c, src, o);
}

}  // namespace test
