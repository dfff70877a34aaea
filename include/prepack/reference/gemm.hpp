// prepack/reference/gemm.hpp - the GEMMs behind the reference model's linear layers, through
// the best library the build found: oneDNN (dnnl_sgemm for fp32, a matmul primitive for bf16
// weights) when prepack::reference was configured with it (PREPACK_HAVE_ONEDNN), Eigen always.
// The backend is chosen per call, so one binary can compare both.
//
// bf16 weights run on every CPU. The function is the same everywhere: weights and activations
// rounded to bf16, products accumulated in fp32. oneDNN's bf16 matmul computes it where this CPU
// runs it (AVX512-BF16, AMX; decided once by creating the primitive; bf16_path() says which
// ISA oneDNN dispatches to); elsewhere, and on the Eigen backend, an fp32 GEMM over the
// bf16-rounded weights and the bf16-rounded activations computes it (emulated). The Eigen
// backend never calls oneDNN.
//
// Threads: both honour the caller's count through OpenMP (one runtime: oneDNN's is the GNU one
// GCC builds use; builds on another runtime, clang's LLVM OpenMP, are configured without
// oneDNN and say so). Cost: m * n * k multiply-adds; no allocation on the fp32 paths; the bf16
// paths round the activations into a buffer the caller keeps (gemm_scratch).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../numeric.hpp"
#include "matrix.hpp"

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

/// How bf16 weights are multiplied on a backend, on this CPU.
struct bf16_support {
  bool native = false;  // oneDNN's bf16 matmul (else fp32 GEMMs over bf16-rounded values)
  std::string isa;      // the instruction set oneDNN dispatches to ("avx512_core_bf16",
                        // "avx2"), or "eigen"
  /// "native (avx512_core_bf16)", "emulated on avx2", "emulated on eigen".
  std::string describe() const { return native ? "native (" + isa + ")" : "emulated on " + isa; }
};

/// Buffers the bf16 paths round activations into, kept by the caller between calls (the
/// reference model keeps one in its workspace). Not shared between concurrent calls.
struct gemm_scratch {
  std::vector<std::uint16_t> bf16;  // [m][k]  activations as bf16 (native path)
  std::vector<float> rounded;       // [m][k]  activations rounded to bf16, as fp32 (emulated)
  std::size_t bytes() const noexcept {
    return bf16.size() * sizeof(std::uint16_t) + rounded.size() * sizeof(float);
  }
};

namespace detail {

#ifdef PREPACK_HAVE_ONEDNN
// oneDNN's name of the instruction set it dispatches to (dnnl_get_effective_cpu_isa).
inline std::string onednn_isa() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  switch (isa) {
    case 0x1:
      return "sse41";
    case 0x3:
      return "avx";
    case 0x7:
      return "avx2";
    case 0x27:
      return "avx512_core";
    case 0x67:
      return "avx512_core_vnni";
    case 0xe7:
      return "avx512_core_bf16";
    case 0x3e7:
      return "avx512_core_amx";
    case 0x407:
      return "avx2_vnni";
    default:
      break;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "isa 0x%x", isa);
  return buf;
}

// The bf16 matmul primitive over a weight in oneDNN's preferred layout, with the row count of
// the activations given at run time. Throws dnnl::error where this CPU has no bf16 matmul.
struct onednn_bf16 {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::matmul matmul;                // C += A B
  std::optional<dnnl::matmul> plain;  // C = A B
  dnnl::memory weights;
  std::int64_t k = 0, n = 0;

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

  void run(std::int64_t m, const std::uint16_t* a16, float* c, std::int64_t ldc,
           bool accumulate) const {
    using dnnl::memory;
    if (!accumulate && !plain) {
      for (std::int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, 0.0f);
    }
    dnnl::stream s(engine);
    memory am(memory::desc({m, k}, memory::data_type::bf16, {k, 1}), engine,
              const_cast<std::uint16_t*>(a16));
    memory cm(memory::desc({m, n}, memory::data_type::f32, {ldc, 1}), engine, c);
    (accumulate || !plain ? matmul : *plain)
        .execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, cm}});
    s.wait();
  }
};

// Whether oneDNN runs a bf16 matmul on this CPU: decided once, by creating a small one.
inline bf16_support onednn_bf16_support() {
  static const bf16_support support = [] {
    bf16_support s;
    try {
      const onednn_bf16 probe(matrix::Zero(16, 16), false);
      s.native = true;
    } catch (const dnnl::error&) {
      s.native = false;
    }
    s.isa = onednn_isa();
    return s;
  }();
  return support;
}
#endif

// Rounds rows [0, m) of a[m][k] (lda) to bf16 into out[m][k], rows in parallel, each a
// branch-free loop the compiler vectorises.
template <class Out, class Convert>
void round_rows(std::int64_t m, std::int64_t k, const float* a, std::int64_t lda, Out* out,
                Convert convert) {
  PREPACK_OMP(parallel for schedule(static))
  for (std::int64_t r = 0; r < m; ++r) {
    const float* src = a + r * lda;
    Out* dst = out + r * k;
    for (std::int64_t j = 0; j < k; ++j) dst[j] = convert(src[j]);
  }
}

}  // namespace detail

/// How bf16 weights are multiplied on backend `b` on this CPU: oneDNN's bf16 matmul where it
/// runs here, else fp32 GEMMs over bf16-rounded values. Throws what resolve() throws.
inline bf16_support bf16_path(gemm_backend b) {
#ifdef PREPACK_HAVE_ONEDNN
  if (resolve(b) == gemm_backend::onednn) return detail::onednn_bf16_support();
#else
  (void)resolve(b);
#endif
  return {false, "eigen"};
}

/// One linear layer's weight, prepared once: w is [in][out] (y = x w), or [out][in] when
/// `transposed` (y = x w^T: the LM head of a model whose embedding is tied to it). With bf16
/// weights, w holds the bf16-rounded values (the emulated paths multiply those), and oneDNN's
/// own bf16 copy is made the first time the native path runs.
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
      bf16_ = std::make_shared<native_state>();
#endif
    }
  }
  Eigen::Index in() const noexcept { return transposed_ ? w_.cols() : w_.rows(); }
  Eigen::Index out() const noexcept { return transposed_ ? w_.rows() : w_.cols(); }
  bool transposed() const noexcept { return transposed_; }
  weight_type type() const noexcept { return type_; }
  const matrix& weights() const noexcept { return w_; }
  /// Bytes of the weight copies held (fp32; and oneDNN's bf16 copy once made).
  std::size_t bytes() const noexcept {
    const std::size_t n = static_cast<std::size_t>(w_.size());
    return n * sizeof(float) + (native_ready() ? n * 2 : 0);
  }

  /// c[m][out] (ldc) = a[m][in] (lda) * W, or += with `accumulate`. 2 m in out FLOPs. bf16
  /// weights round the activations into `scratch` first. Throws prepack::error naming the
  /// shape if oneDNN fails (it does not on shapes it accepted when the layer was built).
  void apply(gemm_backend backend, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
             Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    if (m == 0) return;
    const gemm_backend be = resolve(backend);
    if (type_ == weight_type::bf16) {
      apply_bf16(be, m, a, lda, c, ldc, accumulate, scratch);
      return;
    }
    gemm(be, m, a, lda, c, ldc, accumulate);
  }

 private:
  bool native_ready() const noexcept {
#ifdef PREPACK_HAVE_ONEDNN
    return bf16_ != nullptr && bf16_->ready;
#else
    return false;
#endif
  }

  // The fp32 GEMM of the weights as held.
  void gemm(gemm_backend be, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
            Eigen::Index ldc, bool accumulate) const {
#ifdef PREPACK_HAVE_ONEDNN
    if (be == gemm_backend::onednn) {
      const dnnl_status_t st =
          dnnl_sgemm('N', transposed_ ? 'T' : 'N', m, out(), in(), 1.0f, a, lda, w_.data(),
                     w_.cols(), accumulate ? 1.0f : 0.0f, c, ldc);
      if (st != dnnl_success) {
        prepack::detail::fail("oneDNN sgemm of ", m, " x ", in(), " by ", in(), " x ", out(),
                              " failed (status ", static_cast<int>(st), ")");
      }
      return;
    }
#else
    (void)be;
#endif
    using stride = Eigen::OuterStride<>;
    Eigen::Map<matrix, 0, stride> y(c, m, out(), stride(ldc));
    const Eigen::Map<const matrix, 0, stride> x(a, m, in(), stride(lda));
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

  void apply_bf16(gemm_backend be, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
                  Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    const Eigen::Index k = in();
    const std::size_t size = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
#ifdef PREPACK_HAVE_ONEDNN
    if (be == gemm_backend::onednn && detail::onednn_bf16_support().native) {
      if (scratch.bf16.size() < size) scratch.bf16.resize(size);
      detail::round_rows(m, k, a, lda, scratch.bf16.data(),
                         [](float x) { return bfloat16::from_float(x); });
      try {
        native().run(m, scratch.bf16.data(), c, ldc, accumulate);
      } catch (const dnnl::error& e) {
        prepack::detail::fail("oneDNN bf16 matmul of ", m, " x ", k, " by ", k, " x ", out(),
                              " on ", detail::onednn_isa(), ": ", e.what());
      }
      return;
    }
#endif
    // Emulated: the same function through an fp32 GEMM over bf16-rounded values.
    if (scratch.rounded.size() < size) scratch.rounded.resize(size);
    detail::round_rows(m, k, a, lda, scratch.rounded.data(),
                       [](float x) { return bfloat16::to_float(bfloat16::from_float(x)); });
    gemm(be, m, scratch.rounded.data(), k, c, ldc, accumulate);
  }

#ifdef PREPACK_HAVE_ONEDNN
  // oneDNN's bf16 copy of the weights, made once on first use (the support check above has
  // created one already, so this does not fail for want of an ISA).
  struct native_state {
    std::once_flag once;
    std::unique_ptr<detail::onednn_bf16> prim;
    std::atomic<bool> ready{false};
  };
  const detail::onednn_bf16& native() const {
    std::call_once(bf16_->once, [&] {
      bf16_->prim = std::make_unique<detail::onednn_bf16>(w_, transposed_);
      bf16_->ready = true;
    });
    return *bf16_->prim;
  }
  std::shared_ptr<native_state> bf16_;  // set for bf16 weights; copies of the layer share it
#endif

  matrix w_;  // [in][out], or [out][in] when transposed
  bool transposed_ = false;
  weight_type type_ = weight_type::f32;
};

}  // namespace reference
PREPACK_NAMESPACE_END
