// prepack/reference/gemm.hpp - the GEMMs behind the reference model's linear layers, through
// the best library the build found: oneDNN (its matmul primitive over weights in its own blocked
// layout; dnnl_sgemm over plain fp32) when prepack::reference was configured with it
// (PREPACK_HAVE_ONEDNN), Eigen always. The backend is chosen per call, so one binary can compare
// both; the weights' layout is chosen when a layer is built, for the backend it will mostly run
// on (linear).
//
// bf16 weights run on every CPU. The function is the same everywhere: weights and activations
// rounded to bf16, products accumulated in fp32. oneDNN's bf16 matmul computes it where this CPU
// runs it (AVX512-BF16, AMX; decided once by creating the primitive; bf16_path() says which
// ISA oneDNN dispatches to); elsewhere, and on the Eigen backend, fp32 GEMMs over the bf16
// weights widened a panel at a time and the bf16-rounded activations compute it (emulated).
// Either way a bf16 layer holds its weights once, as bf16.
//
// Threads: both honour the caller's count through OpenMP (one runtime: oneDNN's is the GNU one
// GCC builds use; builds on another runtime, clang's LLVM OpenMP, are configured without
// oneDNN and say so). Cost: m * n * k multiply-adds; no allocation on the plain fp32 paths; the
// others round the activations, make strided ones dense or widen the weights' panels into
// buffers the caller keeps (gemm_scratch), and oneDNN's make a primitive the first time a layer
// sees a row count (rows go in chunks, so a layer makes at most about 130).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../error.hpp"
#include "../numeric.hpp"
#include "matrix.hpp"
#include "quantized.hpp"

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

// A layer's weights as oneDNN's matmul primitive reads them, and the primitives. The layout is
// oneDNN's choice for this shape, type and CPU (a blocked one, BA16a64b for fp32 on AVX-512),
// asked once by creating a primitive that leaves the layout to it; every later primitive is made
// for that layout: one per row count, activation / output stride and accumulate flag, on first
// use, kept (the map is bounded: rows go in chunks of fewer than 64, or of a multiple of 64 up
// to 4096). A layer's weights either live here (allocated by oneDNN, filled by a reorder) or are
// the layer's own plain bf16 weights read in place. Throws dnnl::error where this CPU has no
// matmul of the type.
struct onednn_weights {
  using dt = dnnl::memory::data_type;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::memory::desc md;  // the layout the weights are in
  dnnl::memory mem;       // the weights
  dt type = dt::f32;
  std::int64_t k = 0, n = 0;

  static constexpr std::int64_t chunk_rows = 64, max_rows = 4096;

  // The layout oneDNN's matmul chooses for k x n weights of type t (f32 or bf16) on this CPU.
  static dnnl::memory::desc choose(std::int64_t k, std::int64_t n, dt t) {
    using dnnl::memory;
    const dnnl::engine e(dnnl::engine::kind::cpu, 0);
    const memory::desc a_md({chunk_rows, k}, t, {k, 1});
    const memory::desc b_md({k, n}, t, memory::format_tag::any);
    const memory::desc c_md({chunk_rows, n}, dt::f32, {n, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), e).weights_desc();
  }
  // The plain layout of k x n weights: [k][n] row-major, or [n][k] when transposed.
  static dnnl::memory::desc plain(std::int64_t k, std::int64_t n, dt t, bool transposed) {
    return {{k, n}, t, transposed ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1}};
  }
  // Columns of one block of the layout (1 for plain layouts): panels start at multiples of it.
  static std::int64_t column_block(const dnnl::memory::desc& d) {
    std::int64_t b = 1;
    const auto& blk = d.data.format_desc.blocking;
    for (int i = 0; i < blk.inner_nblks; ++i) {
      if (blk.inner_idxs[i] == 1) b *= blk.inner_blks[i];
    }
    return b;
  }

  // Weights in oneDNN's layout `layout`, filled from `src` (plain, of type src_type, [k][n] or
  // [n][k] when transposed) by a reorder.
  onednn_weights(const dnnl::memory::desc& layout, const void* src, dt src_type, bool transposed)
      : md(layout),
        mem(layout, engine),
        type(layout.data_type()),
        k(layout.dims()[0]),
        n(layout.dims()[1]) {
    dnnl::memory from(plain(k, n, src_type, transposed), engine, const_cast<void*>(src));
    dnnl::stream s(engine);
    dnnl::reorder(from, mem).execute(s, from, mem);
    s.wait();
  }
  // The layout of plain bf16 weights held elsewhere (the layer's own), read in place: `mem`
  // stays empty and run() is given them.
  onednn_weights(std::int64_t k_, std::int64_t n_, bool transposed)
      : md(plain(k_, n_, dt::bf16, transposed)), type(dt::bf16), k(k_), n(n_) {}

  // c[m][n] (ldc) = (or += with `accumulate`) a[m][k] (lda, of this layer's type) * W, W the
  // weights `weights` in this layout (mem's, or the layer's own).
  void run(std::int64_t m, const void* a, std::int64_t lda, const void* weights, float* c,
           std::int64_t ldc, bool accumulate) const {
    using dnnl::memory;
    dnnl::stream s(engine);
    memory wm(md, engine, const_cast<void*>(weights));
    const std::size_t elem = type == dt::f32 ? sizeof(float) : sizeof(std::uint16_t);
    for (std::int64_t r0 = 0; r0 < m;) {
      const std::int64_t left = m - r0;
      const std::int64_t rows =
          left < chunk_rows ? left : std::min(max_rows, left / chunk_rows * chunk_rows);
      const dnnl::matmul& p = primitive(rows, lda, ldc, accumulate);
      memory am(memory::desc({rows, k}, type, {lda, 1}), engine,
                const_cast<char*>(static_cast<const char*>(a)) +
                    static_cast<std::size_t>(r0 * lda) * elem);
      memory cm(memory::desc({rows, n}, dt::f32, {ldc, 1}), engine, c + r0 * ldc);
      p.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}});
      r0 += rows;
    }
    s.wait();
  }

  // Output columns [c0, c0 + w) as fp32, [k][w] row-major, into `panel`: a reorder of a
  // sub-memory (c0 a multiple of the column block; w too, or reaching n).
  void widen(std::int64_t c0, std::int64_t w, float* panel) const {
    using dnnl::memory;
    memory from(md.submemory_desc({k, w}, {0, c0}), engine, mem.get_data_handle());
    memory to(memory::desc({k, w}, dt::f32, {w, 1}), engine, panel);
    dnnl::stream s(engine);
    dnnl::reorder(from, to).execute(s, from, to);
    s.wait();
  }

 private:
  const dnnl::matmul& primitive(std::int64_t rows, std::int64_t lda, std::int64_t ldc,
                                bool accumulate) const {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_tuple(rows, lda, ldc, accumulate);
    const auto it = prims_.find(key);
    if (it != prims_.end()) return it->second;
    using dnnl::memory;
    const memory::desc a_md({rows, k}, type, {lda, 1});
    const memory::desc c_md({rows, n}, dt::f32, {ldc, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {  // C += A B: the residual add
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul p(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, md, c_md), attr, engine));
    return prims_.emplace(key, std::move(p)).first->second;
  }
  mutable std::mutex mu_;
  mutable std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, bool>, dnnl::matmul> prims_;
};

// Whether a k x n layer of type t laid out for oneDNN is held in oneDNN's own layout: where
// the matmul chooses one that is not plain and whose column blocks divide 64 (the panels' unit);
// else the layer stays plain (fp32 on AVX2, where oneDNN chooses plain; bf16 where this CPU
// has no bf16 matmul). nullopt: plain. Asked of oneDNN once per shape and type (the memory
// estimates ask on every pass), then remembered.
inline std::optional<dnnl::memory::desc> onednn_layout(std::int64_t k, std::int64_t n,
                                                       dnnl::memory::data_type t) {
  static std::mutex mu;
  static std::map<std::tuple<std::int64_t, std::int64_t, int>, std::optional<dnnl::memory::desc>>
      known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(k, n, static_cast<int>(t));
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  std::optional<dnnl::memory::desc> d;
  try {
    d = onednn_weights::choose(k, n, t);
    if (*d == onednn_weights::plain(k, n, t, false) || 64 % onednn_weights::column_block(*d) != 0) {
      d.reset();
    }
  } catch (const dnnl::error&) {
    d.reset();
  }
  return known.emplace(key, d).first->second;
}

// Whether oneDNN runs a bf16 matmul on this CPU: decided once, by creating a small one.
inline bf16_support onednn_bf16_support() {
  static const bf16_support support = [] {
    bf16_support s;
    try {
      (void)onednn_weights::choose(16, 16, dnnl::memory::data_type::bf16);
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
#ifdef PREPACK_HAVE_ONEDNN
  if (resolve(b) == gemm_backend::onednn) return detail::onednn_bf16_support();
#else
  (void)resolve(b);
#endif
  return {false, "eigen"};
}

/// Whether a layer of in x out weights of type t, laid out for backend `layout`, is held in
/// oneDNN's own layout on this CPU: `layout` resolves to oneDNN and its matmul chooses a layout
/// that is not plain (fp32 on AVX-512; bf16 where this CPU has a bf16 matmul), with column blocks
/// dividing 64. Cost: creating one primitive descriptor the first time a shape and type is
/// asked, a lookup after. Throws what resolve() throws.
inline bool held_by_onednn(Eigen::Index in, Eigen::Index out, weight_type t, gemm_backend layout) {
#ifdef PREPACK_HAVE_ONEDNN
  if (resolve(layout) != gemm_backend::onednn) return false;
  return detail::onednn_layout(
             in, out,
             t == weight_type::f32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16)
      .has_value();
#else
  (void)in, (void)out, (void)t, (void)resolve(layout);
  return false;
#endif
}

/// One linear layer's weight, prepared once: w is [in][out] (y = x w), or [out][in] when
/// `transposed` (y = x w^T: the LM head of a model whose embedding is tied to it), held once:
/// - laid out for oneDNN (`layout` resolves to it), where its matmul chooses its own layout for
///   this shape and type (held_by_onednn): only in that layout (4 or 2 bytes a weight, plus the
///   layout's padding to its blocks), multiplied by matmul primitives made once per row count.
///   This is what makes few rows (decode) stream the weights at the memory's speed: over plain
///   weights oneDNN repacks them on every call. A call on the Eigen backend (or emulated bf16)
///   widens a panel of columns at a time into scratch through oneDNN reorders (exact).
/// - else plain, as given: fp32 as is (dnnl_sgemm or Eigen read it in place); bf16 as bf16,
///   which oneDNN's bf16 matmul reads in place where this CPU has one, and the emulated paths
///   widen a panel of columns at a time into per-thread scratch (exact: a bf16 value is an fp32
///   value).
/// - quantized: as a checkpoint stores them (quantized_matrix segments of output rows, each of
///   its own ggml type: fused Q | K | V of a Q4_K_M file mixes Q4_K and Q6_K), the bytes of the
///   file and nothing more; every call dots the rows straight from their blocks (up to 8
///   activation rows, the types that can) or decodes a panel of output rows at a time into
///   per-thread fp32 scratch, exactly as ggml defines the type, and multiplies it in register
///   tiles (9-255 rows) or fp32 GEMMs over fp32 activations (so the function is that of the
///   widened weights, within fp32 rounding); or,
///   opted into with `int8_activations` where every segment's type has integer dots
///   (detail::int8_dot_type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
///   IQ4_XS), dotted
///   in integers with the
///   activations quantized to 8 bits per 32-value block (detail::int8_rows: llama.cpp's way,
///   within the bound stated there, each row's result independent of the rows beside it). A
///   quantized layer may scale its input's columns first (`input_scale`: the RMSNorm weight that
///   fp32 layers fold into their rows, which quantized rows cannot absorb exactly).
/// Cost of building: one pass over the weights (a reorder, or a rounding to bf16 and a reorder;
/// quantized segments are moved in).
class linear {
 public:
  linear() = default;
  /// A quantized layer: the segments' rows, one after another, are the output features
  /// ([out][in], so transposed() is true); y = (x . input_scale) W^T, input_scale empty or [in].
  /// Throws prepack::error naming the segment whose width differs from the first's, no
  /// segments, or an input scale of another length.
  linear(std::vector<quantized_matrix> segments, vector input_scale, bool int8_activations = false)
      : q_(std::move(segments)), input_scale_(std::move(input_scale)), transposed_(true) {
    prepack::detail::require(!q_.empty() && !q_[0].empty(), "linear: no quantized rows");
    cols_ = q_[0].cols;
    for (std::size_t i = 0; i < q_.size(); ++i) {
      prepack::detail::require(q_[i].cols == cols_ && !q_[i].empty(), "linear: segment ", i, " (",
                               q_[i].type_name(), ") is ", q_[i].rows, " x ", q_[i].cols,
                               ", the layer's rows are ", cols_, " wide");
      q_start_.push_back(rows_);
      rows_ += q_[i].rows;
    }
    prepack::detail::require(input_scale_.size() == 0 || input_scale_.size() == cols_,
                             "linear: input scale of ", input_scale_.size(), " for ", cols_,
                             " inputs");
    int8_ = int8_activations && cols_ % 32 == 0 &&
            std::all_of(q_.begin(), q_.end(),
                        [](const quantized_matrix& m) { return detail::int8_dot_type(m.type); });
  }
  linear(matrix w, bool transposed, weight_type type, gemm_backend layout = gemm_backend::automatic)
      : rows_(w.rows()), cols_(w.cols()), transposed_(transposed), type_(type) {
#ifdef PREPACK_HAVE_ONEDNN
    using dt = dnnl::memory::data_type;
    const dt t = type_ == weight_type::f32 ? dt::f32 : dt::bf16;
    const std::optional<dnnl::memory::desc> md = resolve(layout) == gemm_backend::onednn
                                                     ? detail::onednn_layout(in(), out(), t)
                                                     : std::nullopt;
    const bool held = md.has_value();
#else
    (void)resolve(layout);
    const bool held = false;
#endif
    if (type_ == weight_type::f32 && !held) {
      w_ = std::move(w);
      return;
    }
    if (type_ == weight_type::bf16) {
      w16_.resize(static_cast<std::size_t>(w.size()));
      const float* src = w.data();
      std::uint16_t* dst = w16_.data();
      const std::size_t size = w16_.size();
      PREPACK_OMP(parallel for schedule(static))
      for (std::size_t i = 0; i < size; ++i) dst[i] = bfloat16::from_float(src[i]);
      w = matrix();
    }
#ifdef PREPACK_HAVE_ONEDNN
    if (held) {
      try {
        held_ = std::make_shared<const detail::onednn_weights>(
            *md, t == dt::f32 ? static_cast<const void*>(w.data()) : w16_.data(), t, transposed_);
      } catch (const dnnl::error& e) {
        prepack::detail::fail("oneDNN reorder of ", in(), " x ", out(), " weights: ", e.what());
      }
      w16_ = std::vector<std::uint16_t>();
    }
#endif
  }
  Eigen::Index in() const noexcept { return transposed_ ? cols_ : rows_; }
  Eigen::Index out() const noexcept { return transposed_ ? rows_ : cols_; }
  bool transposed() const noexcept { return transposed_; }
  weight_type type() const noexcept { return type_; }
  /// Whether the weights are held quantized (see the class comment), and how.
  bool quantized() const noexcept { return !q_.empty(); }
  /// Whether this quantized layer dots its rows with 8-bit activations (asked for, and every
  /// segment's type has integer dots); else its function is that of the widened weights.
  bool int8_activations() const noexcept { return int8_; }
  const std::vector<quantized_matrix>& quantized_segments() const noexcept { return q_; }
  const vector& input_scale() const noexcept { return input_scale_; }
  /// Whether the weights are held in oneDNN's own layout (see the class comment).
  bool held_by_onednn() const noexcept {
#ifdef PREPACK_HAVE_ONEDNN
    return held_ != nullptr;
#else
    return false;
#endif
  }
  /// The fp32 weights held plain (fp32 layers not held by oneDNN; else empty).
  const matrix& weights() const noexcept { return w_; }
  /// The bf16 weights held plain, row-major in the layout w was given in (bf16 layers not held
  /// by oneDNN; else empty).
  const std::vector<std::uint16_t>& weights_bf16() const noexcept { return w16_; }
  /// The weights as multiplied, as fp32 in the layout w was given in ([out][in] for quantized
  /// layers, their input scale not applied), whichever way they are held: a copy (in out
  /// floats), for inspection and tests.
  matrix widened() const {
    matrix m(rows_, cols_);
    if (quantized()) {
      decode_rows(0, rows_, m.data(), false);
      return m;
    }
#ifdef PREPACK_HAVE_ONEDNN
    if (held_) {
      using dnnl::memory;
      memory from = held_->mem;
      memory to(detail::onednn_weights::plain(in(), out(), memory::data_type::f32, transposed_),
                held_->engine, m.data());
      dnnl::stream s(held_->engine);
      dnnl::reorder(from, to).execute(s, from, to);
      s.wait();
      return m;
    }
#endif
    if (type_ == weight_type::f32) return w_;
    for (Eigen::Index i = 0; i < m.size(); ++i) {
      m.data()[i] = bfloat16::to_float(w16_[static_cast<std::size_t>(i)]);
    }
    return m;
  }
  /// Bytes of the weights held: 4 a weight (fp32) or 2 (bf16), and the padding of oneDNN's
  /// layout to its blocks where it holds them.
  std::size_t bytes() const noexcept {
    if (quantized()) {
      std::size_t b = static_cast<std::size_t>(input_scale_.size()) * sizeof(float);
      for (const quantized_matrix& q : q_) b += q.bytes.size();
      return b;
    }
#ifdef PREPACK_HAVE_ONEDNN
    if (held_) return held_->md.get_size();
#endif
    return type_ == weight_type::f32 ? static_cast<std::size_t>(w_.size()) * sizeof(float)
                                     : w16_.size() * sizeof(std::uint16_t);
  }

  /// Columns of the fp32 panel each thread widens weights into on the paths that widen (a
  /// multiple of 64, about 4 MiB of fp32 for this input width).
  static Eigen::Index panel_cols(Eigen::Index in, Eigen::Index out) {
    const Eigen::Index budget = (Eigen::Index{1} << 20) / std::max<Eigen::Index>(in, 1);
    return std::max<Eigen::Index>(64, std::min<Eigen::Index>(out, budget / 64 * 64));
  }
  /// Columns of the panels a quantized layer decodes each thread's share into when few rows
  /// multiply (decode): a multiple of 16, about 128 KiB of fp32, so a panel is decoded and read
  /// back from the core's own cache.
  static Eigen::Index small_panel_cols(Eigen::Index in, Eigen::Index out) {
    const Eigen::Index budget = (Eigen::Index{32} << 10) / std::max<Eigen::Index>(in, 1);
    return std::max<Eigen::Index>(16, std::min<Eigen::Index>(out, budget / 16 * 16));
  }

  /// With 8-bit activations: the activation rows from which a layer converts its weight rows
  /// once per call and multiplies 4 x 4 in registers (AVX512-VNNI builds; a decode driver
  /// measured 16 rows level with the rows' own dots, 24 and 32 ahead), and the weight rows a
  /// thread takes at a time.
  static constexpr Eigen::Index int8_panel_rows = 20, int8_chunk = 16;

  /// Floats of scratch a quantized layer of in x out weights uses at m activation rows where
  /// it multiplies by rows_by_columns (apply_rows_by_columns: from dot_rows + 1 to wide_rows -
  /// 1 rows, on AVX2 / AVX-512 builds; else {0, 0}): gemm_scratch::dense, the input transposed
  /// (shared), and each thread's share of gemm_scratch::panels (its decoded rows and their sums).
  static std::pair<std::size_t, std::size_t> tile_scratch_floats(Eigen::Index in, Eigen::Index out,
                                                                 Eigen::Index m) {
    if (!detail::rows_by_columns_pays || m <= dot_rows || m >= wide_rows) return {0, 0};
    const bool one = m <= Eigen::internal::packet_traits<float>::size;
    const Eigen::Index cols = one ? tile_columns<1>(m) : tile_columns<2>(m);
    return {static_cast<std::size_t>(in) * static_cast<std::size_t>(cols),
            one ? tile_scratch<1>(in, out, m) : tile_scratch<2>(in, out, m)};
  }

  /// c[m][out] (ldc) = a[m][in] (lda) * W, or += with `accumulate`. 2 m in out FLOPs, plus for
  /// bf16 weights m in roundings of the activations into `scratch` and, on the paths that widen
  /// panels, in out widenings of the weights. Throws prepack::error naming the shape if oneDNN
  /// fails (it does not on shapes it accepted when the layer was built).
  void apply(gemm_backend backend, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
             Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    if (m == 0) return;
    const gemm_backend be = resolve(backend);
    if (quantized()) {
      if (int8_) {
        apply_int8(m, a, lda, c, ldc, accumulate, scratch);
      } else if (tile_scratch_floats(in(), out(), m).first > 0) {  // rows_by_columns
        // one packet of columns a tile where a second would be mostly padding
        if (m <= Eigen::internal::packet_traits<float>::size) {
          apply_rows_by_columns<1>(m, a, lda, c, ldc, accumulate, scratch);
        } else {
          apply_rows_by_columns<2>(m, a, lda, c, ldc, accumulate, scratch);
        }
      } else {
        apply_panels(be, m, a, lda, c, ldc, accumulate, scratch);
      }
      return;
    }
#ifdef PREPACK_HAVE_ONEDNN
    if (be == gemm_backend::onednn &&
        (held_ || (type_ == weight_type::bf16 && detail::onednn_bf16_support().native))) {
      apply_onednn(m, a, lda, c, ldc, accumulate, scratch);
      return;
    }
#endif
    if (type_ == weight_type::f32 && !held_by_onednn()) {
      gemm(be, m, a, lda, w_.data(), w_.cols(), transposed_, out(), c, ldc, accumulate);
      return;
    }
    apply_panels(be, m, a, lda, c, ldc, accumulate, scratch);
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

#ifdef PREPACK_HAVE_ONEDNN
  // oneDNN's matmul over the weights it holds, or over plain bf16 weights read in place. Its
  // fast kernels take dense rows only (over strided ones oneDNN falls back to a reference
  // loop): strided activations are copied into scratch first (the model's one case: the down
  // projection reads the gate half of gate | up), strided outputs go through scratch.
  void apply_onednn(Eigen::Index m, const float* a, Eigen::Index lda, float* c, Eigen::Index ldc,
                    bool accumulate, gemm_scratch& scratch) const {
    const Eigen::Index k = in(), n = out();
    const detail::onednn_weights& w = held_ ? *held_ : native();
    const void* weights = held_ ? held_->mem.get_data_handle() : w16_.data();
    const std::size_t mk = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
    const void* x = a;
    if (type_ == weight_type::bf16) {
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
    try {
      w.run(m, x, k, weights, y, n, accumulate);
    } catch (const dnnl::error& e) {
      prepack::detail::fail("oneDNN ", type_ == weight_type::f32 ? "fp32" : "bf16", " matmul of ",
                            m, " x ", k, " by ", k, " x ", n, " on ", detail::onednn_isa(), ": ",
                            e.what());
    }
    if (y != c) {
      PREPACK_OMP(parallel for schedule(static))
      for (Eigen::Index r = 0; r < m; ++r) std::copy_n(y + r * n, n, c + r * ldc);
    }
  }
#endif

  // The paths that widen the weights a panel of output columns at a time into fp32 scratch and
  // multiply that with fp32 GEMMs: bf16 weights where oneDNN's bf16 matmul does not run (over
  // the activations rounded to bf16), and weights held by oneDNN on the Eigen backend.
  void apply_panels(gemm_backend be, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
                    Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    const Eigen::Index k = in();
    const float* x = a;
    Eigen::Index ldx = lda;
    if (type_ == weight_type::bf16) {
      const std::size_t size = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
      if (scratch.rounded.size() < size) scratch.rounded.resize(size);
      detail::round_rows(m, k, a, lda, scratch.rounded.data(),
                         [](float v) { return bfloat16::to_float(bfloat16::from_float(v)); });
      x = scratch.rounded.data();
      ldx = k;
    } else if (input_scale_.size() > 0) {  // quantized: the norm's weight on the input
      x = scaled_input(m, a, lda, scratch);
      ldx = k;
    }
    const Eigen::Index n = out();
    const Eigen::Index nb =
        quantized() && m < wide_rows ? small_panel_cols(k, n) : panel_cols(k, n);
    const Eigen::Index panels = (n + nb - 1) / nb;
    const int threads = threads_for(0);
    // A thread's scratch: a panel [nb][k] (nb >= 16), or on the dot path four rows [4][k].
    const std::size_t per_thread = static_cast<std::size_t>(k) * static_cast<std::size_t>(nb);
    if (scratch.panels.size() < per_thread * static_cast<std::size_t>(threads)) {
      scratch.panels.resize(per_thread * static_cast<std::size_t>(threads));
    }
    // Panels held by oneDNN widen to [k][w]; plain ones keep the layout w was given in.
    const bool bt = transposed_ && !held_by_onednn();
    float* panel_base = scratch.panels.data();
    if (m >= wide_rows) {
      // Many rows: each panel (threads panels' worth of columns) widened by all threads, then
      // one GEMM over it on all threads.
      const Eigen::Index wide = nb * threads;
      for (Eigen::Index c0 = 0; c0 < n; c0 += wide) {
        const Eigen::Index w = std::min(wide, n - c0);
        widen_panel(c0, w, panel_base, true);
        gemm(be, m, x, ldx, panel_base, bt ? k : w, bt, w, c + c0, ldc, accumulate);
      }
      return;
    }
    if (quantized() && m <= dot_rows) {
      // Decode (a few sequences): rows of the types that dot straight from their blocks
      // (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, IQ4_NL, IQ4_XS on AVX2 / AVX-512 builds, Q5_K,
      // Q3_K on
      // AVX-512) are never
      // widened when up to fused_rows activation rows multiply (fused_block rows a pass over a row,
      // which stays in L1 between passes: at 8 rows 1.1-1.8x faster than decoding it, at 16 up
      // to 1.8x slower, measured on the large model's files); the others are decoded four rows at a
      // time into the thread's cache-resident rows and dotted with every activation row, dot_mr
      // rows at a time in registers. Nothing is written to a panel and read back, or packed for a
      // GEMM.
      const bool fuse = m <= fused_rows;
      PREPACK_OMP(parallel for schedule(static) num_threads(threads))
      for (Eigen::Index p = 0; p < panels; ++p) {
        float* rows = panel_base + per_thread * static_cast<std::size_t>(detail::thread_id());
        const Eigen::Index c0 = p * nb, c1 = std::min(n, c0 + nb);
        const auto fused = [&](Eigen::Index j) {
          return fuse && detail::fused_dot_type(q_[segment(j)].type);
        };
        Eigen::Index j0 = c0;
        while (j0 < c1) {
          if (fused(j0)) {
            fused_row(j0, m, x, ldx, c + j0, ldc, accumulate);
            ++j0;
            continue;
          }
          Eigen::Index nr = 1;
          while (nr < 4 && j0 + nr < c1 && !fused(j0 + nr)) ++nr;
          for (Eigen::Index r = 0; r < 4; ++r) {
            if (r < nr) {
              decode_row(j0 + r, rows + r * k);
            } else {
              std::fill(rows + r * k, rows + (r + 1) * k, 0.0f);
            }
          }
          const auto store = [&](Eigen::Index i, const float* y) {
            float* out = c + i * ldc + j0;
            for (Eigen::Index r = 0; r < nr; ++r) out[r] = accumulate ? out[r] + y[r] : y[r];
          };
          Eigen::Index i = 0;
          for (; i + dot_mr <= m; i += dot_mr) {
            float y[dot_mr][4];
            detail::dot_block<dot_mr>(x + i * ldx, ldx, rows, k, y);
            for (Eigen::Index u = 0; u < dot_mr; ++u) store(i + u, y[u]);
          }
          for (; i < m; ++i) {
            float y[1][4];
            detail::dot_block<1>(x + i * ldx, ldx, rows, k, y);
            store(i, y[0]);
          }
          j0 += nr;
        }
      }
      return;
    }
    // Few rows: the panels shared among the threads, each thread's GEMM on that thread alone
    // (decoded panels on Eigen: dnnl_sgemm packs each small panel again on every call, which
    // measured 1.5x slower at 32 rows).
    std::atomic<bool> failed{false};
    std::string failure;
    PREPACK_OMP(parallel for schedule(static) num_threads(threads))
    for (Eigen::Index p = 0; p < panels; ++p) {
      float* panel = panel_base + per_thread * static_cast<std::size_t>(detail::thread_id());
      const Eigen::Index c0 = p * nb, w = std::min(nb, n - c0);
      try {
        widen_panel(c0, w, panel, false);
        gemm(quantized() ? gemm_backend::eigen : be, m, x, ldx, panel, bt ? k : w, bt, w, c + c0,
             ldc, accumulate);
      } catch (const std::exception& e) {
        if (!failed.exchange(true)) failure = e.what();
      }
    }
    if (failed) throw prepack::error(failure);
  }

  // The input's columns times input_scale_ into scratch.rounded ([m][in], dense). O(m in).
  const float* scaled_input(Eigen::Index m, const float* a, Eigen::Index lda,
                            gemm_scratch& scratch) const {
    const Eigen::Index k = in();
    const std::size_t size = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
    if (scratch.rounded.size() < size) scratch.rounded.resize(size);
    float* dst = scratch.rounded.data();
    const float* g = input_scale_.data();
    PREPACK_OMP(parallel for schedule(static))
    for (Eigen::Index r = 0; r < m; ++r) {
      const float* src = a + r * lda;
      float* d = dst + r * k;
      for (Eigen::Index j = 0; j < k; ++j) d[j] = src[j] * g[j];
    }
    return dst;
  }

  // A quantized layer at dot_rows < m < wide_rows activation rows (decode of many sequences,
  // small prefills): the input (scaled) transposed once into scratch.dense ([in][m], columns
  // padded to whole tiles with zeros), then each thread decodes a panel of output rows at a
  // time into its own scratch and multiplies tile_rows of them at a time with every tile of
  // columns (detail::rows_by_columns), reading the decoded rows where they were written:
  // nothing packed again per panel, as the panel GEMMs do (those measured 52% Eigen's kernel,
  // 12% packing the panel and 6% the activations at 32 rows). O(m in) to transpose, O(in out) to
  // decode, O(m in out) to multiply; no allocation once scratch has grown.
  template <int NV>
  void apply_rows_by_columns(Eigen::Index m, const float* a, Eigen::Index lda, float* c,
                             Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    constexpr Eigen::Index mr = detail::tile_rows<NV>(),
                           strip = Eigen::Index{NV} * Eigen::internal::packet_traits<float>::size;
    const Eigen::Index k = in(), n = out(), mp = tile_columns<NV>(m);
    const std::size_t at_size = static_cast<std::size_t>(k) * static_cast<std::size_t>(mp);
    if (scratch.dense.size() < at_size) scratch.dense.resize(at_size);
    float* at = scratch.dense.data();
    const float* g = input_scale_.size() > 0 ? input_scale_.data() : nullptr;
    const int threads = threads_for(0);
    (void)threads;                   // read only by the OpenMP pragmas
    constexpr Eigen::Index tb = 64;  // input columns a thread transposes at a time
    PREPACK_OMP(parallel for schedule(static) num_threads(threads))
    for (Eigen::Index t0 = 0; t0 < k; t0 += tb) {
      const Eigen::Index t1 = std::min(k, t0 + tb);
      for (Eigen::Index i = 0; i < mp; ++i) {
        const float* src = a + i * lda;
        for (Eigen::Index t = t0; t < t1; ++t) {
          at[t * mp + i] = i >= m ? 0.0f : g != nullptr ? src[t] * g[t] : src[t];
        }
      }
    }
    // A thread's scratch (tile_scratch): a panel of nb decoded rows and up to mr - 1 rows of
    // zeros after it, ldw apart, then the panel's sums [nb][mp].
    const Eigen::Index nb = tile_panel_rows<NV>(k, n), ldw = tile_stride(k);
    const std::size_t per_thread = tile_scratch<NV>(k, n, m);
    if (scratch.panels.size() < per_thread * static_cast<std::size_t>(threads)) {
      scratch.panels.resize(per_thread * static_cast<std::size_t>(threads));
    }
    float* panel_base = scratch.panels.data();
    const Eigen::Index panels = (n + nb - 1) / nb;
    // Input columns a pass takes: kc of the transposed input's and the panel's values stay in
    // the core's L2 while every tile of the panel reads them.
    constexpr Eigen::Index kc = 256;
    PREPACK_OMP(parallel for schedule(static) num_threads(threads))
    for (Eigen::Index p = 0; p < panels; ++p) {
      float* rows = panel_base + per_thread * static_cast<std::size_t>(detail::thread_id());
      float* sums = rows + nb * ldw;
      const Eigen::Index c0 = p * nb, w = std::min(nb, n - c0), wp = (w + mr - 1) / mr * mr;
      for (Eigen::Index r = 0; r < w; ++r) decode_row(c0 + r, rows + r * ldw);
      std::fill(rows + w * ldw, rows + wp * ldw, 0.0f);
      for (Eigen::Index k0 = 0; k0 < k; k0 += kc) {
        const Eigen::Index kn = std::min(kc, k - k0);
        for (Eigen::Index i0 = 0; i0 < m; i0 += strip) {
          for (Eigen::Index r0 = 0; r0 < w; r0 += mr) {
            detail::rows_by_columns<NV>(rows + r0 * ldw + k0, ldw, at + k0 * mp + i0, mp, kn,
                                        sums + r0 * mp + i0, mp, k0 > 0);
          }
        }
      }
      for (Eigen::Index i = 0; i < m; ++i) {
        float* out = c + i * ldc + c0;
        for (Eigen::Index r = 0; r < w; ++r) {
          const float y = sums[r * mp + i];
          out[r] = accumulate ? out[r] + y : y;
        }
      }
    }
  }

  // apply_rows_by_columns<NV>'s shapes: the input's columns padded to whole tiles; the rows of
  // a thread's decoded panel (whole tiles, about small_panel_cols of them) and the floats from
  // one to the next: 64 bytes more than a whole number of 64-byte lines, so that a tile's rows,
  // read side by side, do not share the L1 cache's sets (4 KiB apart they would: k = 1024
  // measured 2.3x slower); a thread's scratch, the panel's rows and their sums [rows][columns].
  template <int NV>
  static Eigen::Index tile_columns(Eigen::Index m) {
    constexpr Eigen::Index strip = Eigen::Index{NV} * Eigen::internal::packet_traits<float>::size;
    return (m + strip - 1) / strip * strip;
  }
  template <int NV>
  static Eigen::Index tile_panel_rows(Eigen::Index in, Eigen::Index out) {
    constexpr Eigen::Index mr = detail::tile_rows<NV>();
    return small_panel_cols(in, out) / mr * mr + mr;
  }
  static Eigen::Index tile_stride(Eigen::Index in) { return (in + 15) / 16 * 16 + 16; }
  template <int NV>
  static std::size_t tile_scratch(Eigen::Index in, Eigen::Index out, Eigen::Index m) {
    return static_cast<std::size_t>(tile_panel_rows<NV>(in, out)) *
           static_cast<std::size_t>(tile_stride(in) + tile_columns<NV>(m));
  }

  // The int8 activation path: the input (scaled) quantized a row at a time, then every output
  // row dotted in integers with every activation row (ggml::kernels(type).dot_q8), a tile of
  // activation rows at a time so that a thread's weight rows and the tile stay in its caches; from
  // int8_panel_rows rows with AVX512-VNNI, the weight rows converted once instead
  // (apply_int8_panels), the same bits. O(m in) to quantize, O(m in out) to dot; no allocation
  // once scratch has grown.
  void apply_int8(Eigen::Index m, const float* a, Eigen::Index lda, float* c, Eigen::Index ldc,
                  bool accumulate, gemm_scratch& scratch) const {
    const Eigen::Index k = in(), n = out();
    const float* x = a;
    Eigen::Index ldx = lda;
    if (input_scale_.size() > 0) {
      x = scaled_input(m, a, lda, scratch);
      ldx = k;
    }
    detail::int8_rows& q = scratch.int8;
    q.reset(m, k);
    const int threads = threads_for(0);
    (void)threads;  // read only by the OpenMP pragmas
    PREPACK_OMP(parallel for schedule(static) num_threads(threads) if(m > 1))
    for (Eigen::Index r = 0; r < m; ++r) q.quantize_row(r, x + r * ldx);
    constexpr Eigen::Index tile = 64, chunk = int8_chunk;
    const Eigen::Index chunks = (n + chunk - 1) / chunk;
#if PREPACK_GGML_INT8_PANEL
    if (m >= int8_panel_rows && std::all_of(q_.begin(), q_.end(), [](const quantized_matrix& s) {
          return ggml::kernels(s.type).int8_panel;
        })) {
      apply_int8_panels(m, q, chunk, c, ldc, accumulate, scratch);
      return;
    }
#endif
    PREPACK_OMP(parallel for schedule(static) num_threads(threads))
    for (Eigen::Index ch = 0; ch < chunks; ++ch) {
      const Eigen::Index j0 = ch * chunk, j1 = std::min(n, j0 + chunk);
      for (Eigen::Index t0 = 0; t0 < m; t0 += tile) {
        const Eigen::Index t1 = std::min(m, t0 + tile);
        for (Eigen::Index j = j0; j < j1; ++j) {
          const std::size_t sgi = segment(j);
          const quantized_matrix& w = q_[sgi];
          const unsigned char* row =
              w.bytes.data() + static_cast<std::size_t>(j - q_start_[sgi]) * w.row_bytes;
          const ggml::dot_q8_fn* dot = ggml::kernels(w.type).dot_q8;
          float y[4];
          const auto store = [&](Eigen::Index i, int rows) {
            for (int u = 0; u < rows; ++u) {
              float& out = c[(i + u) * ldc + j];
              out = accumulate ? out + y[u] : y[u];
            }
          };
          Eigen::Index i = t0;
          for (; i + 4 <= t1; i += 4) {
            dot[3](row, k, q, i, y);
            store(i, 4);
          }
          switch (t1 - i) {
            case 3:
              dot[2](row, k, q, i, y);
              store(i, 3);
              break;
            case 2:
              dot[1](row, k, q, i, y);
              store(i, 2);
              break;
            case 1:
              dot[0](row, k, q, i, y);
              store(i, 1);
              break;
            default:
              break;
          }
        }
      }
    }
  }

#if PREPACK_GGML_INT8_PANEL
  // apply_int8 from int8_panel_rows rows: the activations laid out 4 rows at a time, each
  // thread's `chunk` weight rows converted once (detail::int8_weight_rows), then every 4
  // activation rows by 4 of them in registers (detail::int8_tile_dot), the same bits as the
  // rows' int8_dot. O(m in) to lay out, O(out in) to convert, O(m in out) to dot; no allocation
  // once scratch has grown.
  void apply_int8_panels(Eigen::Index m, detail::int8_rows& q, Eigen::Index chunk, float* c,
                         Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    const Eigen::Index k = in(), n = out(), nb = k / 32, tiles = (m + 3) / 4;
    const int threads = threads_for(0);
    q.reset_tiles();
    if (scratch.int8_weights.size() < static_cast<std::size_t>(threads)) {
      scratch.int8_weights.resize(static_cast<std::size_t>(threads));
    }
    for (auto& w : scratch.int8_weights) w.reset(chunk, k);
    PREPACK_OMP(parallel for schedule(static) num_threads(threads))
    for (Eigen::Index t = 0; t < tiles; ++t) q.pack_tile(t);
    const Eigen::Index chunks = (n + chunk - 1) / chunk;
    PREPACK_OMP(parallel for schedule(static) num_threads(threads))
    for (Eigen::Index ch = 0; ch < chunks; ++ch) {
      detail::int8_weight_rows& w =
          scratch.int8_weights[static_cast<std::size_t>(detail::thread_id())];
      const Eigen::Index j0 = ch * chunk, rows = std::min(n, j0 + chunk) - j0;
      for (Eigen::Index r = 0; r < rows; ++r) {
        const std::size_t sgi = segment(j0 + r);
        const quantized_matrix& seg = q_[sgi];
        w.convert_row(
            r, seg.type,
            seg.bytes.data() + static_cast<std::size_t>(j0 + r - q_start_[sgi]) * seg.row_bytes);
      }
      for (Eigen::Index r = rows; r % 4 != 0; ++r) w.clear_row(r);
      for (Eigen::Index t = 0; t < tiles; ++t) {
        const float* as[4];  // the tile's block sums, null past the rows
        for (Eigen::Index i = 0; i < 4; ++i)
          as[i] = 4 * t + i < m ? q.s.data() + (4 * t + i) * nb : nullptr;
        for (Eigen::Index g = 0; g * 4 < rows; ++g) {
          const float* wm[4];  // the group's min weights, null where a row has none
          for (Eigen::Index v = 0; v < 4; ++v) {
            const Eigen::Index col = 4 * g + v;
            wm[v] = col < rows && w.has_min[static_cast<std::size_t>(col)] != 0
                        ? w.min.data() + col * nb
                        : nullptr;
          }
          float y[4][4];
          detail::int8_tile_dot(w.group(g), q.tile(t), w.pairs, nb % 2 == 1, wm, as, y);
          for (Eigen::Index i = 0; i < 4 && 4 * t + i < m; ++i) {
            for (Eigen::Index v = 0; v < 4 && 4 * g + v < rows; ++v) {
              float& o = c[(4 * t + i) * ldc + j0 + 4 * g + v];
              o = accumulate ? o + y[i][v] : y[i][v];
            }
          }
        }
      }
    }
  }
#endif

  // Rows of activations from which the panel paths multiply with all threads per GEMM.
  static constexpr Eigen::Index wide_rows = 256;
  // Rows of activations up to which a quantized layer dots its decoded rows directly, above
  // which it multiplies them by apply_rows_by_columns (where that pays; else by the panel
  // GEMMs: bench_serve's quantized family measured both), and the
  // activation rows each register block holds (4 x 4 accumulators fit AVX-512's 32 vector
  // registers; AVX2's 16 take 2 x 4).
  static constexpr Eigen::Index dot_rows = detail::rows_by_columns_pays ? 8 : 16;
  // Activation rows up to which rows that dot straight from their blocks do so, and how many
  // of them each pass over a row takes.
  static constexpr Eigen::Index fused_rows = 8;
  static constexpr Eigen::Index fused_block = 4;
#ifdef __AVX512F__
  static constexpr int dot_mr = 4;
#else
  static constexpr int dot_mr = 2;
#endif

  // Output columns [c0, c0 + w) of the weights, widened to fp32: [k][w] (held by oneDNN, or
  // plain), or [w][k] (plain, transposed); plain rows shared among the threads when `parallel`
  // (a oneDNN reorder shares them itself outside a parallel region).
  void widen_panel(Eigen::Index c0, Eigen::Index w, float* panel, bool parallel) const {
    if (quantized()) {
      decode_rows(c0, w, panel, parallel);
      return;
    }
#ifdef PREPACK_HAVE_ONEDNN
    if (held_) {
      try {
        held_->widen(c0, w, panel);
      } catch (const dnnl::error& e) {
        prepack::detail::fail("oneDNN reorder of columns ", c0, "..", c0 + w, " of ", in(), " x ",
                              out(), " weights: ", e.what());
      }
      return;
    }
#endif
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

  // The segment holding output row r of a quantized layer.
  std::size_t segment(Eigen::Index r) const noexcept {
    std::size_t s = q_.size() - 1;
    while (q_start_[s] > r) --s;
    return s;
  }

  // Output row r of a quantized layer decoded into out[in], from the segment holding it.
  void decode_row(Eigen::Index r, float* out) const noexcept {
    const std::size_t s = segment(r);
    q_[s].decode_rows(r - q_start_[s], 1, out);
  }

  // c[i][0] (ldc) = a_i . row r (or += with accumulate) for m <= fused_rows activation rows,
  // straight from the row's blocks (its segment's type dots fused).
  void fused_row(Eigen::Index r, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
                 Eigen::Index ldc, bool accumulate) const noexcept {
    const std::size_t s = segment(r);
    const quantized_matrix& q = q_[s];
    const Eigen::Index lr = r - q_start_[s];
    float y[fused_block];
    for (Eigen::Index i0 = 0; i0 < m; i0 += fused_block) {  // the row stays in L1 between blocks
      const Eigen::Index mb = std::min(fused_block, m - i0);
      const float* x = a + i0 * lda;
      switch (mb) {
        case 1:
          q.dot_row<1>(lr, x, lda, y);
          break;
        case 2:
          q.dot_row<2>(lr, x, lda, y);
          break;
        case 3:
          q.dot_row<3>(lr, x, lda, y);
          break;
        default:
          q.dot_row<4>(lr, x, lda, y);
          break;
      }
      for (Eigen::Index i = 0; i < mb; ++i) {
        float& out = c[(i0 + i) * ldc];
        out = accumulate ? out + y[i] : y[i];
      }
    }
  }

  // Output rows [r0, r0 + n) of a quantized layer decoded into out[n][in]; rows shared among the
  // threads when `parallel` (else no OpenMP construct is entered: a nested one costs
  // microseconds per call).
  void decode_rows(Eigen::Index r0, Eigen::Index n, float* out, bool parallel) const {
    const Eigen::Index k = cols_;
    if (!parallel) {
      for (Eigen::Index r = r0; r < r0 + n; ++r) decode_row(r, out + (r - r0) * k);
      return;
    }
    PREPACK_OMP(parallel for schedule(static))
    for (Eigen::Index r = r0; r < r0 + n; ++r) decode_row(r, out + (r - r0) * k);
  }

#ifdef PREPACK_HAVE_ONEDNN
  // The primitives over plain bf16 weights read in place, made once on first use (the support
  // check has created one already, so this does not fail for want of an ISA); copies share them.
  struct native_state {
    std::once_flag once;
    std::unique_ptr<detail::onednn_weights> prim;
  };
  const detail::onednn_weights& native() const {
    std::call_once(native_->once, [&] {
      native_->prim = std::make_unique<detail::onednn_weights>(in(), out(), transposed_);
    });
    return *native_->prim;
  }
  std::shared_ptr<native_state> native_ = std::make_shared<native_state>();
  std::shared_ptr<const detail::onednn_weights> held_;  // the weights in oneDNN's layout
#endif

  std::vector<quantized_matrix> q_;    // quantized: the output rows, segment after segment
  std::vector<Eigen::Index> q_start_;  // each segment's first output row
  vector input_scale_;                 // quantized: [in] multiplying the input, or empty
  matrix w_;                           // fp32, plain: [in][out], or [out][in] when transposed
  std::vector<std::uint16_t> w16_;     // bf16, plain: the same layout
  Eigen::Index rows_ = 0, cols_ = 0;   // of w as given
  bool transposed_ = false;
  bool int8_ = false;  // quantized: rows dotted with 8-bit activations
  weight_type type_ = weight_type::f32;
};

}  // namespace reference
PREPACK_NAMESPACE_END
