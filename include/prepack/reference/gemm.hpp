// prepack/reference/gemm.hpp - the GEMMs behind the reference model's linear layers, through
// the best library the build found: oneDNN (dnnl_sgemm for fp32, a matmul primitive for bf16
// weights) when prepack::reference was configured with it (PREPACK_HAVE_ONEDNN), Eigen always.
// The backend is chosen per call, so one binary can compare both.
//
// bf16 weights run on every CPU. The function is the same everywhere: weights and activations
// rounded to bf16, products accumulated in fp32. oneDNN's bf16 matmul computes it where this CPU
// runs it (AVX512-BF16, AMX; decided once by creating the primitive; bf16_path() says which
// ISA oneDNN dispatches to), reading the layer's bf16 weights in place; elsewhere, and on the
// Eigen backend, fp32 GEMMs over the bf16 weights widened a panel at a time and the
// bf16-rounded activations compute it (emulated). Either way a bf16 layer holds its weights once,
// as bf16. The Eigen backend never calls oneDNN.
//
// Threads: both honour the caller's count through OpenMP (one runtime: oneDNN's is the GNU one
// GCC builds use; builds on another runtime, clang's LLVM OpenMP, are configured without
// oneDNN and say so). Cost: m * n * k multiply-adds; no allocation on the fp32 paths; the bf16
// paths round the activations (and the emulated ones widen the weights' panels) into buffers
// the caller keeps (gemm_scratch).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../numeric.hpp"
#include "matrix.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef PREPACK_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#endif

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Which library multiplies: `automatic` is oneDNN when the build has it, else Eigen.
enum class gemm_backend { automatic, eigen, onednn };

/// The threads a call with `requested` threads (0: all OpenMP offers) uses, without changing
/// any setting. Throws prepack::error for requested < 0.
inline int threads_for(int requested) {
  prepack::detail::require(requested >= 0, "n_threads ", requested);
#ifdef _OPENMP
  return requested > 0 ? requested : omp_get_max_threads();
#else
  return 1;
#endif
}

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
  std::vector<float> panels;        // [threads][k][panel]  weights widened to fp32 (emulated)
  std::size_t bytes() const noexcept {
    return bf16.size() * sizeof(std::uint16_t) + (rounded.size() + panels.size()) * sizeof(float);
  }
};

namespace detail {

// This thread's number in the enclosing OpenMP team (0 outside one).
inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

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

// The bf16 matmul primitives over weights the layer holds as plain bf16 ([k][n] row-major, or
// [n][k] when transposed), read in place (no copy), with the row count of the activations given
// at run time. Throws dnnl::error where this CPU has no bf16 matmul.
struct onednn_bf16 {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::matmul matmul;  // C += A B
  dnnl::matmul plain;   // C = A B
  dnnl::memory::desc b_md;
  std::int64_t k = 0, n = 0;

  onednn_bf16(std::int64_t k_, std::int64_t n_, bool transposed) : k(k_), n(n_) {
    using dnnl::memory;
    const memory::desc a_md({DNNL_RUNTIME_DIM_VAL, k}, memory::data_type::bf16, {k, 1});
    b_md = memory::desc({k, n}, memory::data_type::bf16,
                        transposed ? memory::dims{1, k} : memory::dims{n, 1});
    const memory::desc c_md({DNNL_RUNTIME_DIM_VAL, n}, memory::data_type::f32,
                            {DNNL_RUNTIME_DIM_VAL, 1});
    // Two primitives over the same weights: C = A B, and C += A B (the residual add).
    plain =
        dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine));
    dnnl::post_ops po;
    po.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    matmul = dnnl::matmul(
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine));
  }

  void run(std::int64_t m, const std::uint16_t* a16, const std::uint16_t* b16, float* c,
           std::int64_t ldc, bool accumulate) const {
    using dnnl::memory;
    dnnl::stream s(engine);
    memory am(memory::desc({m, k}, memory::data_type::bf16, {k, 1}), engine,
              const_cast<std::uint16_t*>(a16));
    memory bm(b_md, engine, const_cast<std::uint16_t*>(b16));
    memory cm(memory::desc({m, n}, memory::data_type::f32, {ldc, 1}), engine, c);
    (accumulate ? matmul : plain)
        .execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
  }
};

// Whether oneDNN runs a bf16 matmul on this CPU: decided once, by creating a small one.
inline bf16_support onednn_bf16_support() {
  static const bf16_support support = [] {
    bf16_support s;
    try {
      const onednn_bf16 probe(16, 16, false);
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
/// `transposed` (y = x w^T: the LM head of a model whose embedding is tied to it). fp32 weights
/// are held as given; bf16 weights are held only as bf16 (2 bytes a weight, half of fp32): the
/// native path multiplies them in place, the emulated paths widen a panel of columns at a time
/// into per-thread scratch (exact: a bf16 value is an fp32 value) and multiply that.
class linear {
 public:
  linear() = default;
  linear(matrix w, bool transposed, weight_type type)
      : rows_(w.rows()), cols_(w.cols()), transposed_(transposed), type_(type) {
    if (type_ == weight_type::f32) {
      w_ = std::move(w);
      return;
    }
    w16_.resize(static_cast<std::size_t>(w.size()));
    const float* src = w.data();
    std::uint16_t* dst = w16_.data();
    const std::size_t size = w16_.size();
    PREPACK_OMP(parallel for schedule(static))
    for (std::size_t i = 0; i < size; ++i) dst[i] = bfloat16::from_float(src[i]);
  }
  Eigen::Index in() const noexcept { return transposed_ ? cols_ : rows_; }
  Eigen::Index out() const noexcept { return transposed_ ? rows_ : cols_; }
  bool transposed() const noexcept { return transposed_; }
  weight_type type() const noexcept { return type_; }
  /// The fp32 weights as held (f32 layers only; empty for bf16 ones).
  const matrix& weights() const noexcept { return w_; }
  /// The bf16 weights as held, row-major in the layout w was given in (bf16 layers only).
  const std::vector<std::uint16_t>& weights_bf16() const noexcept { return w16_; }
  /// Bytes of the weights held: 4 a weight (fp32) or 2 (bf16).
  std::size_t bytes() const noexcept {
    return type_ == weight_type::f32 ? static_cast<std::size_t>(w_.size()) * sizeof(float)
                                     : w16_.size() * sizeof(std::uint16_t);
  }

  /// Columns of the fp32 panel each thread widens bf16 weights into on the emulated paths (a
  /// multiple of 16, about 4 MiB of fp32 for this input width), and its floats.
  static Eigen::Index panel_cols(Eigen::Index in, Eigen::Index out) {
    const Eigen::Index budget = (Eigen::Index{1} << 20) / std::max<Eigen::Index>(in, 1);
    return std::max<Eigen::Index>(16, std::min<Eigen::Index>(out, budget / 16 * 16));
  }
  /// Floats of emulated-path panel scratch a call with n_threads threads uses.
  std::size_t panel_floats(int n_threads) const {
    if (type_ != weight_type::bf16) return 0;
    return static_cast<std::size_t>(n_threads) * static_cast<std::size_t>(in()) *
           static_cast<std::size_t>(panel_cols(in(), out()));
  }

  /// c[m][out] (ldc) = a[m][in] (lda) * W, or += with `accumulate`. 2 m in out FLOPs, plus for
  /// bf16 weights m in roundings of the activations into `scratch` and, on the emulated paths,
  /// in out widenings of the weights. Throws prepack::error naming the shape if oneDNN fails
  /// (it does not on shapes it accepted when the layer was built).
  void apply(gemm_backend backend, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
             Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    if (m == 0) return;
    const gemm_backend be = resolve(backend);
    if (type_ == weight_type::bf16) {
      apply_bf16(be, m, a, lda, c, ldc, accumulate, scratch);
      return;
    }
    gemm(be, m, a, lda, w_.data(), w_.cols(), transposed_, out(), c, ldc, accumulate);
  }

 private:
  // c[m][n] (ldc) = (or +=) a[m][k] (lda) * b, b [k][n] (ldb), or [n][k] when `bt`: fp32.
  void gemm(gemm_backend be, Eigen::Index m, const float* a, Eigen::Index lda, const float* b,
            Eigen::Index ldb, bool bt, Eigen::Index n, float* c, Eigen::Index ldc,
            bool accumulate) const {
    const Eigen::Index k = in();
#ifdef PREPACK_HAVE_ONEDNN
    if (be == gemm_backend::onednn) {
      const dnnl_status_t st = dnnl_sgemm('N', bt ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                                          accumulate ? 1.0f : 0.0f, c, ldc);
      if (st != dnnl_success) {
        prepack::detail::fail("oneDNN sgemm of ", m, " x ", k, " by ", k, " x ", n,
                              " failed (status ", static_cast<int>(st), ")");
      }
      return;
    }
#else
    (void)be;
#endif
    using stride = Eigen::OuterStride<>;
    Eigen::Map<matrix, 0, stride> y(c, m, n, stride(ldc));
    const Eigen::Map<const matrix, 0, stride> x(a, m, k, stride(lda));
    if (bt) {
      const Eigen::Map<const matrix, 0, stride> w(b, n, k, stride(ldb));
      if (accumulate) {
        y.noalias() += x * w.transpose();
      } else {
        y.noalias() = x * w.transpose();
      }
    } else {
      const Eigen::Map<const matrix, 0, stride> w(b, k, n, stride(ldb));
      if (accumulate) {
        y.noalias() += x * w;
      } else {
        y.noalias() = x * w;
      }
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
        native().run(m, scratch.bf16.data(), w16_.data(), c, ldc, accumulate);
      } catch (const dnnl::error& e) {
        prepack::detail::fail("oneDNN bf16 matmul of ", m, " x ", k, " by ", k, " x ", out(),
                              " on ", detail::onednn_isa(), ": ", e.what());
      }
      return;
    }
#endif
    // Emulated: the same function through fp32 GEMMs over bf16-rounded activations and the
    // weights widened a panel of output columns at a time, the panels shared among the threads
    // (each thread's GEMM runs on that thread alone).
    if (scratch.rounded.size() < size) scratch.rounded.resize(size);
    detail::round_rows(m, k, a, lda, scratch.rounded.data(),
                       [](float x) { return bfloat16::to_float(bfloat16::from_float(x)); });
    const Eigen::Index n = out(), nb = panel_cols(k, n), panels = (n + nb - 1) / nb;
    const int threads = threads_for(0);
    const std::size_t per_thread = static_cast<std::size_t>(k) * static_cast<std::size_t>(nb);
    if (scratch.panels.size() < per_thread * static_cast<std::size_t>(threads)) {
      scratch.panels.resize(per_thread * static_cast<std::size_t>(threads));
    }
    const float* x = scratch.rounded.data();
    float* panel_base = scratch.panels.data();
    if (m >= wide_rows) {
      // Many rows: each panel (threads panels' worth of columns) widened by all threads, then
      // one GEMM over it on all threads.
      const Eigen::Index wide = nb * threads;
      for (Eigen::Index c0 = 0; c0 < n; c0 += wide) {
        const Eigen::Index w = std::min(wide, n - c0);
        widen_panel(c0, w, panel_base, true);
        gemm(be, m, x, k, panel_base, transposed_ ? k : w, transposed_, w, c + c0, ldc, accumulate);
      }
      return;
    }
    // Few rows: the panels shared among the threads, each thread's GEMM on that thread alone.
    std::atomic<bool> failed{false};
    std::string failure;
    PREPACK_OMP(parallel for schedule(static) num_threads(threads))
    for (Eigen::Index p = 0; p < panels; ++p) {
      float* panel = panel_base + per_thread * static_cast<std::size_t>(detail::thread_id());
      const Eigen::Index c0 = p * nb, w = std::min(nb, n - c0);
      widen_panel(c0, w, panel, false);
      try {
        gemm(be, m, x, k, panel, transposed_ ? k : w, transposed_, w, c + c0, ldc, accumulate);
      } catch (const std::exception& e) {
        if (!failed.exchange(true)) failure = e.what();
      }
    }
    if (failed) throw prepack::error(failure);
  }

  // Rows of activations from which the emulated path multiplies with all threads per GEMM.
  static constexpr Eigen::Index wide_rows = 256;

  // Output columns [c0, c0 + w) of the weights, widened to fp32: [k][w], or [w][k] transposed;
  // the rows shared among the threads when `parallel`.
  void widen_panel(Eigen::Index c0, Eigen::Index w, float* panel, bool parallel) const {
    const Eigen::Index k = in();
    const Eigen::Index rows = transposed_ ? w : k, cols = transposed_ ? k : w;
    const std::uint16_t* src = w16_.data() + (transposed_ ? static_cast<std::size_t>(c0 * k)
                                                          : static_cast<std::size_t>(c0));
    const Eigen::Index stride = transposed_ ? k : cols_;
    (void)parallel;  // read only by the OpenMP pragma
    PREPACK_OMP(parallel for schedule(static) if(parallel))
    for (Eigen::Index r = 0; r < rows; ++r) {
      const std::uint16_t* s = src + r * stride;
      float* d = panel + r * cols;
      for (Eigen::Index j = 0; j < cols; ++j) d[j] = bfloat16::to_float(s[j]);
    }
  }

#ifdef PREPACK_HAVE_ONEDNN
  // oneDNN's primitives over the bf16 weights, made once on first use (the support check above
  // has created one already, so this does not fail for want of an ISA); copies share them.
  struct native_state {
    std::once_flag once;
    std::unique_ptr<detail::onednn_bf16> prim;
  };
  const detail::onednn_bf16& native() const {
    std::call_once(native_->once, [&] {
      native_->prim = std::make_unique<detail::onednn_bf16>(in(), out(), transposed_);
    });
    return *native_->prim;
  }
  std::shared_ptr<native_state> native_ = std::make_shared<native_state>();
#endif

  matrix w_;                          // fp32: [in][out], or [out][in] when transposed
  std::vector<std::uint16_t> w16_;    // bf16: the same layout
  Eigen::Index rows_ = 0, cols_ = 0;  // of w as given
  bool transposed_ = false;
  weight_type type_ = weight_type::f32;
};

}  // namespace reference
PREPACK_NAMESPACE_END
