// prepack/reference/linear.hpp - the reference model's linear layer: one weight, prepared once,
// in one of two forms, each a class valid in every state it can be in:
// - dense_linear (dense_linear.hpp): fp32 or bf16 weights, plain or in oneDNN's layout;
// - quantized_linear (quantized_linear.hpp): ggml's quantized blocks as a checkpoint stores
//   them, dotted with fp32 or 8-bit activations.
// `linear` holds one of them and answers for either, so the model's layers are of one type.
// The GEMMs both use are in gemm.hpp; what is asked of oneDNN is in onednn.hpp.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <variant>
#include <vector>

#include "dense_linear.hpp"
#include "gemm.hpp"
#include "matrix.hpp"
#include "quantized.hpp"
#include "quantized_linear.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// One linear layer's weight: dense (fp32 or bf16: dense_linear, whose comment says how they are
/// held) or quantized (quantized_linear). A default-made layer is dense, fp32, with no weights.
/// Every member costs what the form's own does; the accessors of one form answer empty (or
/// false) for the other.
class linear {
 public:
  linear() = default;
  linear(dense_linear d) : form_(std::move(d)) {}      // NOLINT(google-explicit-constructor)
  linear(quantized_linear q) : form_(std::move(q)) {}  // NOLINT(google-explicit-constructor)
  /// A quantized layer (quantized_linear's constructor, and what it throws).
  linear(std::vector<quantized_matrix> segments, vector input_scale, bool int8_activations = false)
      : form_(quantized_linear(std::move(segments), std::move(input_scale), int8_activations)) {}
  /// A dense layer (dense_linear's constructor, and what it throws).
  linear(matrix w, bool transposed, weight_type type, gemm_backend layout = gemm_backend::automatic)
      : form_(dense_linear(std::move(w), transposed, type, layout)) {}

  /// The form, or null for the other.
  const dense_linear* dense() const noexcept { return std::get_if<dense_linear>(&form_); }
  const quantized_linear* quantized_form() const noexcept {
    return std::get_if<quantized_linear>(&form_);
  }

  Eigen::Index in() const noexcept {
    return std::visit([](const auto& f) { return f.in(); }, form_);
  }
  Eigen::Index out() const noexcept {
    return std::visit([](const auto& f) { return f.out(); }, form_);
  }
  /// Whether the weights were given [out][in] (y = x W^T): always for a quantized layer.
  bool transposed() const noexcept {
    const dense_linear* d = dense();
    return d == nullptr || d->transposed();
  }
  /// The dense weights' type (f32 for a quantized layer: its products are fp32).
  weight_type type() const noexcept {
    const dense_linear* d = dense();
    return d != nullptr ? d->type() : weight_type::f32;
  }
  /// Whether the weights are held quantized.
  bool quantized() const noexcept { return quantized_form() != nullptr; }
  /// Whether this quantized layer dots its rows with 8-bit activations (asked for, and every
  /// segment's type has integer dots); else its function is that of the widened weights.
  bool int8_activations() const noexcept {
    const quantized_linear* q = quantized_form();
    return q != nullptr && q->int8_activations();
  }
  /// A quantized layer's segments (empty for a dense one).
  const std::vector<quantized_matrix>& quantized_segments() const noexcept {
    static const std::vector<quantized_matrix> none;
    const quantized_linear* q = quantized_form();
    return q != nullptr ? q->segments() : none;
  }
  /// A quantized layer's input scale (empty for a dense one).
  const vector& input_scale() const noexcept {
    static const vector none;
    const quantized_linear* q = quantized_form();
    return q != nullptr ? q->input_scale() : none;
  }
  /// Whether a dense layer's weights are held in oneDNN's own layout.
  bool held_by_onednn() const noexcept {
    const dense_linear* d = dense();
    return d != nullptr && d->held_by_onednn();
  }
  /// A dense layer's fp32 / bf16 weights held plain (else empty).
  const matrix& weights() const noexcept {
    static const matrix none;
    const dense_linear* d = dense();
    return d != nullptr ? d->weights() : none;
  }
  const std::vector<std::uint16_t>& weights_bf16() const noexcept {
    static const std::vector<std::uint16_t> none;
    const dense_linear* d = dense();
    return d != nullptr ? d->weights_bf16() : none;
  }
  /// The weights as multiplied, as fp32 in the layout given ([out][in] for quantized layers,
  /// their input scale not applied): a copy (in out floats), for inspection and tests.
  matrix widened() const {
    return std::visit([](const auto& f) { return f.widened(); }, form_);
  }
  /// Bytes of the weights held.
  std::size_t bytes() const {
    return std::visit([](const auto& f) { return f.bytes(); }, form_);
  }

  /// See reference::panel_cols.
  static Eigen::Index panel_cols(Eigen::Index in, Eigen::Index out) {
    return reference::panel_cols(in, out);
  }
  /// See quantized_linear::tile_scratch_floats.
  static std::pair<std::size_t, std::size_t> tile_scratch_floats(Eigen::Index in, Eigen::Index out,
                                                                 Eigen::Index m) {
    return quantized_linear::tile_scratch_floats(in, out, m);
  }
  static constexpr Eigen::Index int8_panel_rows = quantized_linear::int8_panel_rows,
                                int8_chunk = quantized_linear::int8_chunk;

  /// c[m][out] (ldc) = a[m][in] (lda) * W, or += with `accumulate`: the form's apply, its cost
  /// and what it throws.
  void apply(gemm_backend backend, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
             Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    std::visit([&](const auto& f) { f.apply(backend, m, a, lda, c, ldc, accumulate, scratch); },
               form_);
  }

 private:
  std::variant<dense_linear, quantized_linear> form_;
};

}  // namespace reference
PREPACK_NAMESPACE_END
