// prepack/reference/dense_linear.hpp - a linear layer whose weights are fp32 or bf16, prepared
// once and held once, in one of three forms (dense_linear::form): plain fp32, plain bf16, or in
// the layout oneDNN's matmul chooses (onednn::held_weights). linear.hpp's `linear` holds one of
// these or a quantized_linear.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <variant>
#include <vector>

#include "../error.hpp"
#include "../numeric.hpp"
#include "gemm.hpp"
#include "matrix.hpp"
#include "onednn.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// One linear layer's fp32 or bf16 weight: w is [in][out] (y = x w), or [out][in] when
/// `transposed` (y = x w^T: the LM head of a model whose embedding is tied to it), held once:
/// - laid out for oneDNN (`layout` resolves to it), where its matmul chooses its own layout for
///   this shape and type (held_by_onednn): only in that layout (4 or 2 bytes a weight, plus the
///   layout's padding to its blocks), multiplied by matmul primitives made once per row count.
///   A call on the Eigen backend (or emulated bf16) widens a panel of columns at a time into
///   scratch through oneDNN reorders (exact).
/// - else plain, as given: fp32 as is (dnnl_sgemm or Eigen read it in place); bf16 as bf16,
///   which oneDNN's bf16 matmul reads in place where this CPU has one, and the emulated paths
///   widen a panel of columns at a time into per-thread scratch (exact: a bf16 value is an fp32
///   value).
/// A default-made layer is plain fp32 with no weights (0 x 0). Cost of building: one pass over
/// the weights (a reorder, or a rounding to bf16 and a reorder).
class dense_linear {
 public:
  /// How the weights are held.
  enum class form { plain_f32, plain_bf16, onednn };

  dense_linear() = default;
  /// Throws what resolve(layout) throws, or prepack::error naming the shape if oneDNN fails to
  /// reorder the weights.
  dense_linear(matrix w, bool transposed, weight_type type,
               gemm_backend layout = gemm_backend::automatic)
      : rows_(w.rows()), cols_(w.cols()), transposed_(transposed) {
    const bool for_onednn = resolve(layout) == gemm_backend::onednn;
    std::vector<std::uint16_t> w16;
    if (type == weight_type::bf16) {
      w16.resize(static_cast<std::size_t>(w.size()));
      const float* src = w.data();
      std::uint16_t* dst = w16.data();
      const std::size_t size = w16.size();
      PREPACK_OMP(parallel for schedule(static))
      for (std::size_t i = 0; i < size; ++i) dst[i] = bfloat16::from_float(src[i]);
      w = matrix();
    }
    if (for_onednn) {
      auto h = onednn::held_weights::hold(
          in(), out(), type,
          type == weight_type::f32 ? static_cast<const void*>(w.data()) : w16.data(), transposed);
      if (h) {
        w_ = std::move(h);
        return;
      }
    }
    if (type == weight_type::f32) {
      w_ = plain_f32{std::move(w)};
    } else {
      w_ = plain_bf16{std::move(w16), {}};
    }
  }

  Eigen::Index in() const noexcept { return transposed_ ? cols_ : rows_; }
  Eigen::Index out() const noexcept { return transposed_ ? rows_ : cols_; }
  bool transposed() const noexcept { return transposed_; }
  form held_as() const noexcept { return static_cast<form>(w_.index()); }
  weight_type type() const noexcept {
    if (const auto* h = std::get_if<held>(&w_)) return (*h)->type();
    return held_as() == form::plain_f32 ? weight_type::f32 : weight_type::bf16;
  }
  /// Whether the weights are held in oneDNN's own layout (see the class comment).
  bool held_by_onednn() const noexcept { return held_as() == form::onednn; }
  /// The fp32 weights held plain (fp32 layers not held by oneDNN; else empty).
  const matrix& weights() const noexcept {
    static const matrix none;
    const auto* p = std::get_if<plain_f32>(&w_);
    return p != nullptr ? p->w : none;
  }
  /// The bf16 weights held plain, row-major in the layout w was given in (bf16 layers not held
  /// by oneDNN; else empty).
  const std::vector<std::uint16_t>& weights_bf16() const noexcept {
    static const std::vector<std::uint16_t> none;
    const auto* p = std::get_if<plain_bf16>(&w_);
    return p != nullptr ? p->w : none;
  }
  /// The weights as multiplied, as fp32 in the layout w was given in, whichever way they are
  /// held: a copy (in out floats), for inspection and tests.
  matrix widened() const {
    if (const auto* p = std::get_if<plain_f32>(&w_)) return p->w;
    matrix m(rows_, cols_);
    if (const auto* h = std::get_if<held>(&w_)) {
      (*h)->widen_all(m.data(), transposed_);
      return m;
    }
    const std::vector<std::uint16_t>& w = std::get<plain_bf16>(w_).w;
    for (Eigen::Index i = 0; i < m.size(); ++i) {
      m.data()[i] = bfloat16::to_float(w[static_cast<std::size_t>(i)]);
    }
    return m;
  }
  /// Bytes of the weights held: 4 a weight (fp32) or 2 (bf16), and the padding of oneDNN's
  /// layout to its blocks where it holds them.
  std::size_t bytes() const {
    if (const auto* h = std::get_if<held>(&w_)) return (*h)->bytes();
    if (const auto* p = std::get_if<plain_f32>(&w_)) {
      return static_cast<std::size_t>(p->w.size()) * sizeof(float);
    }
    return std::get<plain_bf16>(w_).w.size() * sizeof(std::uint16_t);
  }

  /// c[m][out] (ldc) = a[m][in] (lda) * W, or += with `accumulate`. 2 m in out FLOPs, plus for
  /// bf16 weights m in roundings of the activations into `scratch` and, on the paths that widen
  /// panels, in out widenings of the weights: oneDNN's matmul where it holds the weights or runs
  /// bf16 natively, an fp32 GEMM over plain fp32 weights, else panel GEMMs (detail::panel_gemm).
  /// Throws prepack::error naming the shape if oneDNN fails (it does not on shapes it accepted
  /// when the layer was built).
  void apply(gemm_backend backend, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
             Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    if (m == 0) return;
    const gemm_backend be = resolve(backend);
    if (be == gemm_backend::onednn &&
        (held_by_onednn() || (held_as() == form::plain_bf16 && onednn::bf16_native()))) {
      apply_onednn(m, a, lda, c, ldc, accumulate, scratch);
      return;
    }
    if (const auto* p = std::get_if<plain_f32>(&w_)) {
      detail::sgemm(be, m, in(), a, lda, p->w.data(), p->w.cols(), transposed_, out(), c, ldc,
                    accumulate);
      return;
    }
    // bf16 weights where oneDNN's bf16 matmul does not run (over the activations rounded to
    // bf16), and weights held by oneDNN on the Eigen backend: panels widened to fp32.
    const Eigen::Index k = in();
    const float* x = a;
    Eigen::Index ldx = lda;
    if (type() == weight_type::bf16) {
      const std::size_t size = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
      if (scratch.rounded.size() < size) scratch.rounded.resize(size);
      detail::round_rows(m, k, a, lda, scratch.rounded.data(),
                         [](float v) { return bfloat16::to_float(bfloat16::from_float(v)); });
      x = scratch.rounded.data();
      ldx = k;
    }
    // Panels held by oneDNN widen to [k][w]; plain ones keep the layout w was given in.
    const bool bt = transposed_ && !held_by_onednn();
    detail::panel_gemm(
        be, be, m, x, ldx, k, out(), panel_cols(k, out()), bt,
        [this](Eigen::Index c0, Eigen::Index w, float* panel, bool parallel) {
          widen_panel(c0, w, panel, parallel);
        },
        c, ldc, accumulate, scratch.panels);
  }

 private:
  struct plain_f32 {
    matrix w;  // [in][out], or [out][in] when transposed
  };
  struct plain_bf16 {
    std::vector<std::uint16_t> w;  // the same layout
    onednn::plain_bf16 native;     // oneDNN's bf16 matmul over w, where this CPU has one
  };
  using held = std::shared_ptr<const onednn::held_weights>;  // never null

  // oneDNN's matmul over the weights it holds, or over plain bf16 weights read in place. Its
  // fast kernels take dense rows only (over strided ones oneDNN falls back to a reference
  // loop): strided activations are copied into scratch first (the model's one case: the down
  // projection reads the gate half of gate | up), strided outputs go through scratch.
  void apply_onednn(Eigen::Index m, const float* a, Eigen::Index lda, float* c, Eigen::Index ldc,
                    bool accumulate, gemm_scratch& scratch) const {
    const Eigen::Index k = in(), n = out();
    const std::size_t mk = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
    const void* x = a;
    if (type() == weight_type::bf16) {
      if (scratch.bf16.size() < mk) scratch.bf16.resize(mk);
      detail::round_rows(m, k, a, lda, scratch.bf16.data(),
                         [](float v) { return bfloat16::from_float(v); });
      x = scratch.bf16.data();
    } else if (lda != k) {
      if (scratch.dense.size() < mk) scratch.dense.resize(mk);
      detail::round_rows(m, k, a, lda, scratch.dense.data(), [](float v) { return v; });
      x = scratch.dense.data();
    }
    float* y = c;
    if (ldc != n) {
      const std::size_t mn = static_cast<std::size_t>(m) * static_cast<std::size_t>(n);
      if (scratch.out.size() < mn) scratch.out.resize(mn);
      y = scratch.out.data();
      if (accumulate) detail::round_rows(m, n, c, ldc, y, [](float v) { return v; });
    }
    if (const auto* h = std::get_if<held>(&w_)) {
      (*h)->matmul(m, x, k, y, n, accumulate);
    } else {
      const plain_bf16& p = std::get<plain_bf16>(w_);
      p.native.matmul(k, n, transposed_, p.w.data(), m, static_cast<const std::uint16_t*>(x), k, y,
                      n, accumulate);
    }
    if (y != c) {
      PREPACK_OMP(parallel for schedule(static))
      for (Eigen::Index r = 0; r < m; ++r) std::copy_n(y + r * n, n, c + r * ldc);
    }
  }

  // Output columns [c0, c0 + w) of the weights, widened to fp32: [k][w] (held by oneDNN, or
  // plain), or [w][k] (plain, transposed); plain rows shared among the threads when `parallel`
  // (a oneDNN reorder shares them itself outside a parallel region).
  void widen_panel(Eigen::Index c0, Eigen::Index w, float* panel, bool parallel) const {
    if (const auto* h = std::get_if<held>(&w_)) {
      (*h)->widen(c0, w, panel);
      return;
    }
    const Eigen::Index k = in();
    const Eigen::Index rows = transposed_ ? w : k, cols = transposed_ ? k : w;
    const std::size_t first =
        transposed_ ? static_cast<std::size_t>(c0 * k) : static_cast<std::size_t>(c0);
    const Eigen::Index stride = transposed_ ? k : cols_;
    const auto widen = [&](const auto* src, auto to_float) {
      (void)parallel;  // read only by the OpenMP pragma
      PREPACK_OMP(parallel for schedule(static) if(parallel))
      for (Eigen::Index r = 0; r < rows; ++r) {
        const auto* s = src + first + static_cast<std::size_t>(r * stride);
        float* d = panel + r * cols;
        for (Eigen::Index j = 0; j < cols; ++j) d[j] = to_float(s[j]);
      }
    };
    if (const auto* p = std::get_if<plain_bf16>(&w_)) {
      widen(p->w.data(), [](std::uint16_t v) { return bfloat16::to_float(v); });
    } else {
      widen(std::get<plain_f32>(w_).w.data(), [](float v) { return v; });
    }
  }

  std::variant<plain_f32, plain_bf16, held> w_;
  Eigen::Index rows_ = 0, cols_ = 0;  // of w as given
  bool transposed_ = false;
};

}  // namespace reference
PREPACK_NAMESPACE_END
