// prepack/reference/gemm.hpp - the GEMMs behind the reference model's linear layers: which library
// multiplies (gemm_backend: oneDNN when prepack::reference was configured with it, Eigen
// always; chosen per call, so one binary can compare both), the scratch the layers keep, and the
// kernels they share: the fp32 GEMM on either library (detail::sgemm), the panel GEMMs over
// weights widened a panel of columns at a time (detail::panel_gemm), and the register-tiled dots
// (detail::dot_block, detail::rows_by_columns). The layers themselves are in linear.hpp, one
// class per form of weights (dense_linear.hpp, quantized_linear.hpp); what is asked of oneDNN is
// in onednn.hpp.
//
// bf16 weights run on every CPU. The function is the same everywhere: weights and activations
// rounded to bf16, products accumulated in fp32. oneDNN's bf16 matmul computes it where this CPU
// runs it (AVX512-BF16, AMX; decided once by creating the primitive; bf16_path() says which
// ISA oneDNN dispatches to); elsewhere, and on the Eigen backend, fp32 GEMMs over the bf16
// weights widened a panel at a time and the bf16-rounded activations compute it (emulated).
//
// Threads: both honour the caller's count through OpenMP (one runtime: oneDNN's is the GNU one
// GCC builds use; builds on another runtime, clang's LLVM OpenMP, are configured without
// oneDNN and say so). Cost: m * n * k multiply-adds; no allocation on the plain fp32 paths; the
// others round the activations, make strided ones dense or widen the weights' panels into
// buffers the caller keeps (gemm_scratch).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "matrix.hpp"
#include "onednn.hpp"
#include "quantized.hpp"

#ifdef _OPENMP
#include <omp.h>
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
constexpr bool onednn_available() noexcept { return onednn::available(); }

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
  std::vector<float> dense;         // [m][k]  strided fp32 activations, made dense for oneDNN
  std::vector<float> out;           // [m][n]  strided outputs, through oneDNN densely
  detail::int8_rows int8;           // [m][k]  activations in 8 bits (int8 activation mode)
  std::vector<detail::int8_weight_rows> int8_weights;  // [threads]  their converted weight rows
  std::size_t bytes() const noexcept {
    std::size_t n = bf16.size() * sizeof(std::uint16_t) +
                    (rounded.size() + panels.size() + dense.size() + out.size()) * sizeof(float) +
                    int8.bytes();
    for (const auto& w : int8_weights) n += w.bytes();
    return n;
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

// out[i][j] = dot(a row i, w row j) for MR activation rows a[MR][k] (lda) and 4 weight rows
// w[4][k] (contiguous), with Eigen's SIMD packets: 4 MR accumulators kept in registers, each
// activation and weight packet loaded once per k step (MR 2: 6 loads per 8 FMAs). The sums run
// in a fixed order, so a result does not depend on the rows it is computed beside. O(MR 4 k).
// Eigen's packets are vector types with attributes, which GCC warns about as template arguments
// (Eigen silences the same warning in its own headers).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
template <int MR>
void dot_block(const float* a, std::int64_t lda, const float* w, std::int64_t k,
               float (&out)[MR][4]) noexcept {
  namespace ei = Eigen::internal;
  using packet = ei::packet_traits<float>::type;
  constexpr std::int64_t lanes = ei::packet_traits<float>::size;
  packet acc[MR][4];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < 4; ++j) acc[i][j] = ei::pset1<packet>(0.0f);
  }
  std::int64_t t = 0;
  for (; t + lanes <= k; t += lanes) {
    packet wj[4];
    for (int j = 0; j < 4; ++j) wj[j] = ei::ploadu<packet>(w + j * k + t);
    for (int i = 0; i < MR; ++i) {
      const packet ai = ei::ploadu<packet>(a + i * lda + t);
      for (int j = 0; j < 4; ++j) acc[i][j] = ei::pmadd(ai, wj[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < 4; ++j) {
      float sum = ei::predux(acc[i][j]);
      for (std::int64_t u = t; u < k; ++u) sum += a[i * lda + u] * w[j * k + u];
      out[i][j] = sum;
    }
  }
}

// The tiles of rows_by_columns: weight rows a call takes against nv packets of columns,
// filling the vector registers with accumulators (AVX-512's 32: 12 x 2 or 24 x 1; AVX2's and
// SSE's 16: 6 x 2 or 12 x 1).
template <int NV>
constexpr int tile_rows() noexcept {
  return (Eigen::internal::packet_traits<float>::size >= 16 ? 24 : 12) / NV;
}

// Whether rows_by_columns beats the decoded rows' dots and panel GEMMs (apply_panels): with
// 256- and 512-bit vectors (at 16 - 200 rows 1.2-1.35x on AVX2, 1.5-2.8x on AVX-512, level at
// 9-12 on AVX2); with SSE's 128 bits (no FMA) it measured 0.6-0.96x, and those builds keep them.
constexpr bool rows_by_columns_pays = Eigen::internal::packet_traits<float>::size >= 8;

// f(0), ..., f(N - 1), each index a constant (std::integral_constant).
template <int N, class F, int... I>
inline void unrolled(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
inline void unrolled(F&& f) {
  unrolled<N>(std::forward<F>(f), std::make_integer_sequence<int, N>{});
}

// out[r][i] (ldo) = w row r . column i of at, or += with `add`, for tile_rows<NV>() rows of w
// ([.][ldw], k values each) and the NV lanes columns of at ([k][ldat]): per step t NV packets of
// at and a broadcast of each row's value, into the tile's accumulators held in registers (24
// multiply-adds per 14 loads with NV 2 on AVX-512). Each sum runs over t in order, one
// multiply-add a step (k split into calls with `add` continues the same chain), so a result does
// not depend on the rows and columns computed beside it. O(rows NV lanes k).
template <int NV>
void rows_by_columns(const float* w, std::int64_t ldw, const float* at, std::int64_t ldat,
                     std::int64_t k, float* out, std::int64_t ldo, bool add) noexcept {
  namespace ei = Eigen::internal;
  using packet = ei::packet_traits<float>::type;
  constexpr std::int64_t lanes = ei::packet_traits<float>::size;
  constexpr int mr = tile_rows<NV>();
  packet acc[mr][NV];
  for (int r = 0; r < mr; ++r) {
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = add ? ei::ploadu<packet>(out + r * ldo + v * lanes) : ei::pset1<packet>(0.0f);
    }
  }
  for (std::int64_t t = 0; t < k; ++t) {
    packet b[NV];
    for (int v = 0; v < NV; ++v) b[v] = ei::ploadu<packet>(at + t * ldat + v * lanes);
    // unrolled by the template, not left to the compiler (which kept 24 x 1 accumulators in
    // memory: 2x slower)
    unrolled<mr>([&](auto r) {
      const packet x = ei::pset1<packet>(w[r * ldw + t]);
      for (int v = 0; v < NV; ++v) acc[r][v] = ei::pmadd(x, b[v], acc[r][v]);
    });
  }
  for (int r = 0; r < mr; ++r) {
    for (int v = 0; v < NV; ++v) ei::pstoreu(out + r * ldo + v * lanes, acc[r][v]);
  }
}
#pragma GCC diagnostic pop

}  // namespace detail

/// How bf16 weights are multiplied on backend `b` on this CPU: oneDNN's bf16 matmul where it
/// runs here, else fp32 GEMMs over bf16-rounded values. Throws what resolve() throws.
inline bf16_support bf16_path(gemm_backend b) {
  if (resolve(b) == gemm_backend::onednn) return {onednn::bf16_native(), onednn::isa()};
  return {false, "eigen"};
}

/// Whether a layer of in x out weights of type t, laid out for backend `layout`, is held in
/// oneDNN's own layout on this CPU: `layout` resolves to oneDNN and its matmul chooses a layout
/// that is not plain (fp32 on AVX-512; bf16 where this CPU has a bf16 matmul), with column blocks
/// dividing 64. Cost: creating one primitive descriptor the first time a shape and type is
/// asked, a lookup after. Throws what resolve() throws.
inline bool held_by_onednn(Eigen::Index in, Eigen::Index out, weight_type t, gemm_backend layout) {
  return resolve(layout) == gemm_backend::onednn && onednn::holds(in, out, t);
}

/// Columns of the fp32 panel each thread widens weights into on the paths that widen (a
/// multiple of 64, about 4 MiB of fp32 for this input width).
inline Eigen::Index panel_cols(Eigen::Index in, Eigen::Index out) {
  const Eigen::Index budget = (Eigen::Index{1} << 20) / std::max<Eigen::Index>(in, 1);
  return std::max<Eigen::Index>(64, std::min<Eigen::Index>(out, budget / 64 * 64));
}

namespace detail {

// Rows of activations from which the panel GEMMs multiply with all threads per GEMM.
constexpr Eigen::Index wide_rows = 256;

// c[m][n] (ldc) = (or += with `accumulate`) a[m][k] (lda) * b, b [k][n] (ldb), or [n][k] when
// `bt`: fp32, dnnl_sgemm on oneDNN, Eigen's GEMM on Eigen (be resolved). Throws prepack::error
// naming the shape if oneDNN fails.
inline void sgemm(gemm_backend be, Eigen::Index m, Eigen::Index k, const float* a, Eigen::Index lda,
                  const float* b, Eigen::Index ldb, bool bt, Eigen::Index n, float* c,
                  Eigen::Index ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum (oneDNN refuses the shape)
    if (!accumulate) {
      for (Eigen::Index r = 0; r < m; ++r) std::fill_n(c + r * ldc, n, 0.0f);
    }
    return;
  }
  if (be == gemm_backend::onednn) {
    onednn::sgemm(m, n, k, a, lda, b, ldb, bt, c, ldc, accumulate);
    return;
  }
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

// c[m][n] (ldc) = (or += with `accumulate`) x[m][k] (ldx) * W over fp32 panels of W's columns
// that widen(c0, w, panel, parallel) writes: [k][w], or [w][k] when `bt`. From wide_rows rows,
// each panel (threads panels' worth of nb columns) widened by all threads, then one GEMM over it
// on backend `be` on all threads; below, panels of nb columns shared among the threads, each
// thread's GEMM on that thread alone on backend `narrow`. The panels live in `panels` (grown to
// threads * k * nb floats). O(in out) to widen, 2 m in out FLOPs. Throws the first failure of a
// thread's widening or GEMM, as prepack::error.
template <class Widen>
void panel_gemm(gemm_backend be, gemm_backend narrow, Eigen::Index m, const float* x,
                Eigen::Index ldx, Eigen::Index k, Eigen::Index n, Eigen::Index nb, bool bt,
                const Widen& widen, float* c, Eigen::Index ldc, bool accumulate,
                std::vector<float>& panels) {
  const int threads = threads_for(0);
  const std::size_t per_thread = static_cast<std::size_t>(k) * static_cast<std::size_t>(nb);
  if (panels.size() < per_thread * static_cast<std::size_t>(threads)) {
    panels.resize(per_thread * static_cast<std::size_t>(threads));
  }
  float* panel_base = panels.data();
  if (m >= wide_rows) {
    const Eigen::Index wide = nb * threads;
    for (Eigen::Index c0 = 0; c0 < n; c0 += wide) {
      const Eigen::Index w = std::min(wide, n - c0);
      widen(c0, w, panel_base, true);
      sgemm(be, m, k, x, ldx, panel_base, bt ? k : w, bt, w, c + c0, ldc, accumulate);
    }
    return;
  }
  // Few rows: the panels shared among the threads (on Eigen for decoded panels: dnnl_sgemm packs
  // each small panel again on every call, which measured 1.5x slower at 32 rows).
  const Eigen::Index n_panels = (n + nb - 1) / nb;
  std::atomic<bool> failed{false};
  std::string failure;
  PREPACK_OMP(parallel for schedule(static) num_threads(threads))
  for (Eigen::Index p = 0; p < n_panels; ++p) {
    float* panel = panel_base + per_thread * static_cast<std::size_t>(thread_id());
    const Eigen::Index c0 = p * nb, w = std::min(nb, n - c0);
    try {
      widen(c0, w, panel, false);
      sgemm(narrow, m, k, x, ldx, panel, bt ? k : w, bt, w, c + c0, ldc, accumulate);
    } catch (const std::exception& e) {
      if (!failed.exchange(true)) failure = e.what();
    }
  }
  if (failed) throw prepack::error(failure);
}

}  // namespace detail

}  // namespace reference
PREPACK_NAMESPACE_END
