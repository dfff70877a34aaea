// prepack/reference/gemm.hpp - the GEMMs behind the reference model's linear layers, through
// the best library the build found: oneDNN (dnnl_sgemm for fp32, a matmul primitive for bf16
// weights) when prepack::reference was configured with it (PREPACK_HAVE_ONEDNN), Eigen always.
// The backend is chosen per call, so one binary can compare both.
//
// Threads: both honour the caller's count through OpenMP (one runtime: oneDNN's is the GNU one
// GCC builds use; builds on another runtime, clang's LLVM OpenMP, are configured without
// oneDNN and say so). Cost: m * n * k multiply-adds; no allocation on the fp32 paths; the bf16
// path converts the activations to bf16 into a buffer it keeps between calls.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../numeric.hpp"
#include "detail/ops.hpp"

#ifdef PREPACK_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#endif

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Which library multiplies: `automatic` is oneDNN when the build has it, else Eigen.
enum class gemm_backend { automatic, eigen, onednn };

/// Whether this build can use oneDNN (PREPACK_HAVE_ONEDNN, set by CMake when it found oneDNN
/// and the compiler's OpenMP runtime is oneDNN's own).
constexpr bool onednn_available() noexcept {
#ifdef PREPACK_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}

/// The backend `b` resolves to in this build: `automatic` is the environment's
/// PREPACK_GEMM_BACKEND (eigen or onednn) when set, else oneDNN when the build has it, else
/// Eigen. Throws prepack::error for onednn in a build without it, or an unknown name in the
/// environment.
inline gemm_backend resolve(gemm_backend b) {
  if (b == gemm_backend::automatic) {
    const char* env = std::getenv("PREPACK_GEMM_BACKEND");
    if (env == nullptr || *env == '\0') {
      return onednn_available() ? gemm_backend::onednn : gemm_backend::eigen;
    }
    const std::string name = env;
    prepack::detail::require(name == "eigen" || name == "onednn", "PREPACK_GEMM_BACKEND '", name,
                             "' (eigen or onednn)");
    b = name == "eigen" ? gemm_backend::eigen : gemm_backend::onednn;
  }
  prepack::detail::require(b != gemm_backend::onednn || onednn_available(),
                           "gemm backend onednn: this build has no oneDNN (configure with "
                           "libdnnl-dev installed, under GCC's OpenMP)");
  return b;
}

inline const char* backend_name(gemm_backend b) {
  switch (b) {
    case gemm_backend::automatic:
      return backend_name(resolve(b));
    case gemm_backend::eigen:
      return "eigen";
    case gemm_backend::onednn:
      return "onednn";
  }
  return "?";
}

/// The element type the projection weights are held in: fp32, or bf16 (weights rounded to
/// bf16 once; the activations they multiply are rounded to bf16 too and the products are
/// accumulated in fp32, as AVX512-BF16 computes them).
enum class weight_type { f32, bf16 };

inline const char* weight_type_name(weight_type t) {
  return t == weight_type::bf16 ? "bf16" : "f32";
}

namespace detail {

#ifdef PREPACK_HAVE_ONEDNN
// A bf16 weight in oneDNN's preferred layout and the matmul primitive that multiplies by it,
// with the row count of the activations given at run time.
struct onednn_bf16 {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::matmul matmul;                // C += A B
  std::optional<dnnl::matmul> plain;  // C = A B
  dnnl::memory weights;
  std::int64_t k = 0, n = 0;
  std::mutex lock;                 // one call at a time (the conversion buffer is shared)
  std::vector<std::uint16_t> a16;  // [rows][k]  the activations in bf16

  onednn_bf16(const matrix& w, bool transposed) {
    using dnnl::memory;
    k = transposed ? w.cols() : w.rows();
    n = transposed ? w.rows() : w.cols();
    const memory::desc a_md({DNNL_RUNTIME_DIM_VAL, k}, memory::data_type::bf16, {k, 1});
    const memory::desc b_md({k, n}, memory::data_type::bf16, memory::format_tag::any);
    const memory::desc c_md({DNNL_RUNTIME_DIM_VAL, n}, memory::data_type::f32,
                            {DNNL_RUNTIME_DIM_VAL, 1});
    // Two primitives over the same weights: C = A B, and C += A B (the residual add).
    const auto plain_pd =
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    dnnl::post_ops po;
    po.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    const auto sum_pd =
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
    matmul = dnnl::matmul(sum_pd);
    // Both take the weights in the same layout (they differ only in the post-op); if a build
    // ever disagreed, C is zeroed and the accumulating one used.
    if (plain_pd.weights_desc() == sum_pd.weights_desc()) plain = dnnl::matmul(plain_pd);
    std::vector<std::uint16_t> b16(static_cast<std::size_t>(k * n));
    for (std::int64_t r = 0; r < k; ++r) {
      for (std::int64_t c = 0; c < n; ++c) {
        const float v = transposed ? w(c, r) : w(r, c);
        b16[static_cast<std::size_t>(r * n + c)] = bfloat16::from_float(v);
      }
    }
    dnnl::stream s(engine);
    memory src(memory::desc({k, n}, memory::data_type::bf16, {n, 1}), engine, b16.data());
    weights = memory(sum_pd.weights_desc(), engine);
    dnnl::reorder(src, weights).execute(s, src, weights);
    s.wait();
  }

  void run(std::int64_t m, const float* a, std::int64_t lda, float* c, std::int64_t ldc,
           bool accumulate) {
    using dnnl::memory;
    std::lock_guard<std::mutex> guard(lock);
    a16.resize(static_cast<std::size_t>(m * k));
    std::uint16_t* out = a16.data();
    const std::int64_t kk = k;
    // Rows in parallel; each a branch-free loop the compiler vectorises.
    PREPACK_OMP(parallel for schedule(static))
    for (std::int64_t r = 0; r < m; ++r) {
      const float* src = a + r * lda;
      std::uint16_t* dst = out + r * kk;
      for (std::int64_t j = 0; j < kk; ++j) dst[j] = bfloat16::from_float(src[j]);
    }
    if (!accumulate && !plain) {
      for (std::int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, 0.0f);
    }
    dnnl::stream s(engine);
    memory am(memory::desc({m, k}, memory::data_type::bf16, {k, 1}), engine, a16.data());
    memory cm(memory::desc({m, n}, memory::data_type::f32, {ldc, 1}), engine, c);
    (accumulate || !plain ? matmul : *plain)
        .execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, cm}});
    s.wait();
  }
};
#endif

}  // namespace detail

/// One linear layer's weight, prepared once: w is [in][out] (y = x w), or [out][in] when
/// `transposed` (y = x w^T: the LM head of a model whose embedding is tied to it). With bf16
/// weights, w holds the bf16-rounded values (the Eigen path multiplies those, rounding the
/// activations the same way), and oneDNN keeps its own bf16 copy.
class linear {
 public:
  linear() = default;
  linear(matrix w, bool transposed, weight_type type)
      : w_(std::move(w)), transposed_(transposed), type_(type) {
    if (type_ == weight_type::bf16) {
      for (Eigen::Index i = 0; i < w_.size(); ++i) {
        w_.data()[i] = bfloat16::to_float(bfloat16::from_float(w_.data()[i]));
      }
#ifdef PREPACK_HAVE_ONEDNN
      bf16_ = std::make_shared<detail::onednn_bf16>(w_, transposed_);
#endif
    }
  }
  Eigen::Index in() const noexcept { return transposed_ ? w_.cols() : w_.rows(); }
  Eigen::Index out() const noexcept { return transposed_ ? w_.rows() : w_.cols(); }
  bool transposed() const noexcept { return transposed_; }
  weight_type type() const noexcept { return type_; }
  const matrix& weights() const noexcept { return w_; }
  std::size_t bytes() const noexcept {
    const std::size_t n = static_cast<std::size_t>(w_.size());
    return n * sizeof(float) + (type_ == weight_type::bf16 && onednn_available() ? n * 2 : 0);
  }

  /// c[m][out] (ldc) = a[m][in] (lda) * W, or += with `accumulate`. 2 m in out FLOPs.
  void apply(gemm_backend backend, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
             Eigen::Index ldc, bool accumulate) const {
    if (m == 0) return;
    if (resolve(backend) == gemm_backend::onednn) {
#ifdef PREPACK_HAVE_ONEDNN
      if (type_ == weight_type::bf16) {
        bf16_->run(m, a, lda, c, ldc, accumulate);
        return;
      }
      dnnl_sgemm('N', transposed_ ? 'T' : 'N', m, out(), in(), 1.0f, a, lda, w_.data(), w_.cols(),
                 accumulate ? 1.0f : 0.0f, c, ldc);
      return;
#endif
    }
    using stride = Eigen::OuterStride<>;
    using rows_map = Eigen::Map<const matrix, 0, stride>;
    Eigen::Map<matrix, 0, stride> y(c, m, out(), stride(ldc));
    if (type_ == weight_type::bf16) {
      // The same function as the oneDNN path: activations rounded to bf16 first.
      matrix x = rows_map(a, m, in(), stride(lda));
      for (Eigen::Index i = 0; i < x.size(); ++i) {
        x.data()[i] = bfloat16::to_float(bfloat16::from_float(x.data()[i]));
      }
      product(x, y, accumulate);
      return;
    }
    product(rows_map(a, m, in(), stride(lda)), y, accumulate);
  }

 private:
  template <class X, class Y>
  void product(const X& x, Y& y, bool accumulate) const {
    if (transposed_) {
      if (accumulate) {
        y.noalias() += x * w_.transpose();
      } else {
        y.noalias() = x * w_.transpose();
      }
    } else if (accumulate) {
      y.noalias() += x * w_;
    } else {
      y.noalias() = x * w_;
    }
  }

  matrix w_;  // [in][out], or [out][in] when transposed
  bool transposed_ = false;
  weight_type type_ = weight_type::f32;
#ifdef PREPACK_HAVE_ONEDNN
  std::shared_ptr<detail::onednn_bf16> bf16_;
#endif
};

}  // namespace reference
PREPACK_NAMESPACE_END
