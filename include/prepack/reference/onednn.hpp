// prepack/reference/onednn.hpp - everything the reference model asks of oneDNN, in one place:
// whether the build has it, the instruction set it dispatches to, its fp32 GEMM (dnnl_sgemm),
// weights held in the layout its matmul chooses (onednn::held_weights) and its bf16 matmul over
// plain bf16 weights read in place (onednn::plain_bf16). The build has oneDNN where CMake found
// it under the compiler's OpenMP runtime (PREPACK_HAVE_ONEDNN); without it every name here still
// exists, available() is false, hold() holds nothing, and the calls that only a oneDNN build can
// reach throw prepack::error (resolve() in gemm.hpp never picks oneDNN there).
//
// Cost: a primitive made the first time a layer sees a row count, activation / output stride
// and accumulate flag (rows go in chunks of fewer than 64, or of a multiple of 64 up to 4096,
// so a layer makes at most about 130), a lookup after; the layout a shape and type gets is asked
// of oneDNN once per process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "../error.hpp"
#include "matrix.hpp"

#ifdef PREPACK_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <tuple>
#endif

PREPACK_NAMESPACE_BEGIN
namespace reference::onednn {

#ifdef PREPACK_HAVE_ONEDNN

/// Whether this build can use oneDNN.
constexpr bool available() noexcept { return true; }

/// oneDNN's name of the instruction set it dispatches to ("avx2", "avx512_core_bf16", ...).
inline std::string isa() {
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

/// c[m][n] (ldc) = (or += with `accumulate`) a[m][k] (lda) * b, b [k][n] (ldb) or [n][k] when
/// `bt`: dnnl_sgemm, on the caller's OpenMP threads. Throws prepack::error naming the shape if
/// oneDNN reports a failure.
inline void sgemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                  const float* b, std::int64_t ldb, bool bt, float* c, std::int64_t ldc,
                  bool accumulate) {
  const dnnl_status_t st = dnnl_sgemm('N', bt ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                                      accumulate ? 1.0f : 0.0f, c, ldc);
  prepack::detail::require(st == dnnl_success, "oneDNN sgemm of ", m, " x ", k, " by ", k, " x ", n,
                           " failed (status ", static_cast<int>(st), ")");
}

namespace detail {

using dt = dnnl::memory::data_type;
inline dt data_type(weight_type t) { return t == weight_type::f32 ? dt::f32 : dt::bf16; }

// The plain layout of k x n weights: [k][n] row-major, or [n][k] when transposed.
inline dnnl::memory::desc plain(std::int64_t k, std::int64_t n, dt t, bool transposed) {
  return {{k, n}, t, transposed ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1}};
}

constexpr std::int64_t chunk_rows = 64, max_rows = 4096;

// The layout oneDNN's matmul chooses for k x n weights of type t on this CPU. Throws
// dnnl::error where this CPU has no matmul of the type.
inline dnnl::memory::desc choose(std::int64_t k, std::int64_t n, dt t) {
  using dnnl::memory;
  const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  const memory::desc a_md({chunk_rows, k}, t, {k, 1});
  const memory::desc b_md({k, n}, t, memory::format_tag::any);
  const memory::desc c_md({chunk_rows, n}, dt::f32, {n, 1});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), e).weights_desc();
}

// Columns of one block of the layout (1 for plain layouts): panels start at multiples of it.
inline std::int64_t column_block(const dnnl::memory::desc& d) {
  std::int64_t b = 1;
  const auto& blk = d.data.format_desc.blocking;
  for (int i = 0; i < blk.inner_nblks; ++i) {
    if (blk.inner_idxs[i] == 1) b *= blk.inner_blks[i];
  }
  return b;
}

// The layout a k x n layer of type t is held in: oneDNN's own where its matmul chooses one that
// is not plain and whose column blocks divide 64 (the panels' unit); nullopt where the layer
// stays plain (fp32 on AVX2, where oneDNN chooses plain; bf16 where this CPU has no bf16
// matmul). Asked of oneDNN once per shape and type (the memory estimates ask on every pass).
inline std::optional<dnnl::memory::desc> layout(std::int64_t k, std::int64_t n, dt t) {
  static std::mutex mu;
  static std::map<std::tuple<std::int64_t, std::int64_t, int>, std::optional<dnnl::memory::desc>>
      known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(k, n, static_cast<int>(t));
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  std::optional<dnnl::memory::desc> d;
  try {
    d = choose(k, n, t);
    if (*d == plain(k, n, t, false) || 64 % column_block(*d) != 0) d.reset();
  } catch (const dnnl::error&) {
    d.reset();
  }
  return known.emplace(key, d).first->second;
}

// Matmul primitives over k x n weights in layout md, one per row count, activation / output
// stride and accumulate flag, made on first use and kept (see the file comment for the bound).
class matmuls {
 public:
  explicit matmuls(dnnl::memory::desc md) : md_(std::move(md)) {}
  const dnnl::engine& engine() const noexcept { return engine_; }
  const dnnl::memory::desc& desc() const noexcept { return md_; }

  // c[m][n] (ldc) = (or += with `accumulate`) a[m][k] (lda, of the weights' type) * W, W the
  // weights at `weights` in this layout.
  void run(std::int64_t m, const void* a, std::int64_t lda, const void* weights, float* c,
           std::int64_t ldc, bool accumulate) const {
    using dnnl::memory;
    const std::int64_t k = md_.dims()[0], n = md_.dims()[1];
    const dt type = md_.data_type();
    dnnl::stream s(engine_);
    memory wm(md_, engine_, const_cast<void*>(weights));
    const std::size_t elem = type == dt::f32 ? sizeof(float) : sizeof(std::uint16_t);
    for (std::int64_t r0 = 0; r0 < m;) {
      const std::int64_t left = m - r0;
      const std::int64_t rows =
          left < chunk_rows ? left : std::min(max_rows, left / chunk_rows * chunk_rows);
      const dnnl::matmul& p = primitive(rows, lda, ldc, accumulate);
      memory am(memory::desc({rows, k}, type, {lda, 1}), engine_,
                const_cast<char*>(static_cast<const char*>(a)) +
                    static_cast<std::size_t>(r0 * lda) * elem);
      memory cm(memory::desc({rows, n}, dt::f32, {ldc, 1}), engine_, c + r0 * ldc);
      p.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}});
      r0 += rows;
    }
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
    const std::int64_t k = md_.dims()[0], n = md_.dims()[1];
    const memory::desc a_md({rows, k}, md_.data_type(), {lda, 1});
    const memory::desc c_md({rows, n}, dt::f32, {ldc, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {  // C += A B: the residual add
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul p(
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, md_, c_md), attr, engine_));
    return prims_.emplace(key, std::move(p)).first->second;
  }
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::memory::desc md_;
  mutable std::mutex mu_;
  mutable std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, bool>, dnnl::matmul> prims_;
};

// f(), a oneDNN failure in it thrown as prepack::error: what, then oneDNN's text and ISA.
template <class F, class... What>
auto rethrown(F&& f, const What&... what) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    prepack::detail::fail(what..., ": ", e.what(), " (oneDNN on ", isa(), ")");
  }
}

}  // namespace detail

/// Whether oneDNN runs a bf16 matmul on this CPU: decided once, by creating a small one.
inline bool bf16_native() {
  static const bool native = [] {
    try {
      (void)detail::choose(16, 16, detail::dt::bf16);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

/// Whether k x n weights of type t are held in oneDNN's own layout on this CPU (see
/// held_weights::hold). A lookup after the first call for a shape and type.
inline bool holds(std::int64_t k, std::int64_t n, weight_type t) {
  return detail::layout(k, n, detail::data_type(t)).has_value();
}

/// A layer's k x n weights in the layout oneDNN's matmul chooses for this shape, type and CPU (a
/// blocked one, BA16a64b for fp32 on AVX-512), with the matmul primitives over them. This is what
/// makes few rows (decode) stream the weights at the memory's speed: over plain weights oneDNN
/// repacks them on every call.
class held_weights {
 public:
  /// The weights at `src` (plain, [k][n], or [n][k] when `transposed`; fp32 or bf16 as `t`) in
  /// oneDNN's layout, where holds(k, n, t); else null, and the caller keeps them plain. One
  /// reorder. Throws prepack::error naming the shape if oneDNN fails.
  static std::shared_ptr<const held_weights> hold(std::int64_t k, std::int64_t n, weight_type t,
                                                  const void* src, bool transposed) {
    const std::optional<dnnl::memory::desc> md = detail::layout(k, n, detail::data_type(t));
    if (!md) return nullptr;
    return detail::rethrown(
        [&] { return std::shared_ptr<const held_weights>(new held_weights(*md, src, transposed)); },
        "oneDNN reorder of ", k, " x ", n, " weights into its layout");
  }

  weight_type type() const noexcept {
    return prims_.desc().data_type() == detail::dt::f32 ? weight_type::f32 : weight_type::bf16;
  }
  /// Bytes held: the weights and the layout's padding to its blocks.
  std::size_t bytes() const { return prims_.desc().get_size(); }

  /// c[m][n] (ldc) = (or +=) a[m][k] (lda, fp32 or bf16 as the weights) * W. Throws
  /// prepack::error if oneDNN fails.
  void matmul(std::int64_t m, const void* a, std::int64_t lda, float* c, std::int64_t ldc,
              bool accumulate) const {
    detail::rethrown([&] { prims_.run(m, a, lda, mem_.get_data_handle(), c, ldc, accumulate); },
                     "oneDNN ", weight_type_name(type()), " matmul of ", m, " x ",
                     prims_.desc().dims()[0], " by weights of ", prims_.desc().dims()[0], " x ",
                     prims_.desc().dims()[1]);
  }

  /// Output columns [c0, c0 + w) as fp32, [k][w] row-major, into `panel`: a reorder of a
  /// sub-memory (c0 a multiple of the column block, which divides 64; w too, or reaching n).
  void widen(std::int64_t c0, std::int64_t w, float* panel) const {
    detail::rethrown(
        [&] {
          using dnnl::memory;
          const std::int64_t k = prims_.desc().dims()[0];
          memory from(prims_.desc().submemory_desc({k, w}, {0, c0}), prims_.engine(),
                      mem_.get_data_handle());
          memory to(memory::desc({k, w}, detail::dt::f32, {w, 1}), prims_.engine(), panel);
          dnnl::stream s(prims_.engine());
          dnnl::reorder(from, to).execute(s, from, to);
          s.wait();
        },
        "oneDNN reorder of columns ", c0, "..", c0 + w, " of ", prims_.desc().dims()[0], " x ",
        prims_.desc().dims()[1], " weights");
  }

  /// All the weights as fp32 into out, plain ([k][n], or [n][k] when `transposed`).
  void widen_all(float* out, bool transposed) const {
    detail::rethrown(
        [&] {
          using dnnl::memory;
          const std::int64_t k = prims_.desc().dims()[0], n = prims_.desc().dims()[1];
          memory from = mem_;
          memory to(detail::plain(k, n, detail::dt::f32, transposed), prims_.engine(), out);
          dnnl::stream s(prims_.engine());
          dnnl::reorder(from, to).execute(s, from, to);
          s.wait();
        },
        "oneDNN reorder of ", prims_.desc().dims()[0], " x ", prims_.desc().dims()[1],
        " weights out of its layout");
  }

 private:
  held_weights(const dnnl::memory::desc& md, const void* src, bool transposed)
      : prims_(md), mem_(md, prims_.engine()) {
    const std::int64_t k = md.dims()[0], n = md.dims()[1];
    dnnl::memory from(detail::plain(k, n, md.data_type(), transposed), prims_.engine(),
                      const_cast<void*>(src));
    dnnl::stream s(prims_.engine());
    dnnl::reorder(from, mem_).execute(s, from, mem_);
    s.wait();
  }
  detail::matmuls prims_;
  dnnl::memory mem_;
};

/// oneDNN's bf16 matmul over plain bf16 weights that the caller holds, read in place: the
/// primitives made once on first use (bf16_native() has created one already, so this does not
/// fail for want of an ISA). Copies share them.
class plain_bf16 {
 public:
  plain_bf16() = default;
  /// c[m][n] (ldc) = (or +=) a[m][k] (lda, bf16) * w, w bf16 [k][n], or [n][k] when
  /// `transposed`. Throws prepack::error if oneDNN fails.
  void matmul(std::int64_t k, std::int64_t n, bool transposed, const std::uint16_t* w,
              std::int64_t m, const std::uint16_t* a, std::int64_t lda, float* c, std::int64_t ldc,
              bool accumulate) const {
    detail::rethrown(
        [&] {
          std::call_once(state_->once, [&] {
            state_->prims = std::make_unique<detail::matmuls>(
                detail::plain(k, n, detail::dt::bf16, transposed));
          });
          state_->prims->run(m, a, lda, w, c, ldc, accumulate);
        },
        "oneDNN bf16 matmul of ", m, " x ", k, " by plain weights of ", k, " x ", n);
  }

 private:
  struct state {
    std::once_flag once;
    std::unique_ptr<detail::matmuls> prims;
  };
  std::shared_ptr<state> state_ = std::make_shared<state>();
};

#else  // no oneDNN: the same names; nothing is held, and what only oneDNN runs throws

constexpr bool available() noexcept { return false; }
inline std::string isa() { return "none"; }
inline bool bf16_native() { return false; }
inline bool holds(std::int64_t, std::int64_t, weight_type) { return false; }

namespace detail {
[[noreturn]] inline void absent() {
  prepack::detail::fail(
      "oneDNN: this build has no oneDNN (configure with libdnnl-dev installed, "
      "under GCC's OpenMP)");
}
}  // namespace detail

inline void sgemm(std::int64_t, std::int64_t, std::int64_t, const float*, std::int64_t,
                  const float*, std::int64_t, bool, float*, std::int64_t, bool) {
  detail::absent();
}

class held_weights {
 public:
  static std::shared_ptr<const held_weights> hold(std::int64_t, std::int64_t, weight_type,
                                                  const void*, bool) {
    return nullptr;
  }
  weight_type type() const noexcept { return weight_type::f32; }
  std::size_t bytes() const { return 0; }
  void matmul(std::int64_t, const void*, std::int64_t, float*, std::int64_t, bool) const {
    detail::absent();
  }
  void widen(std::int64_t, std::int64_t, float*) const { detail::absent(); }
  void widen_all(float*, bool) const { detail::absent(); }

 private:
  held_weights() = default;  // never made: hold() holds nothing
};

class plain_bf16 {
 public:
  void matmul(std::int64_t, std::int64_t, bool, const std::uint16_t*, std::int64_t,
              const std::uint16_t*, std::int64_t, float*, std::int64_t, bool) const {
    detail::absent();
  }
};

#endif

}  // namespace reference::onednn
PREPACK_NAMESPACE_END
