// prepack/reference/workspace.hpp - what a forward pass of the reference model runs on besides
// its weights: the threads (OpenMP, the caller's count, restored after the call), the
// activation buffers it keeps between passes (declared once, so the memory report and
// estimate_prefill_memory count exactly what a pass allocates), and the per-thread attention
// scratch. Cost: a pass of n rows and n_out outputs holds n * (hidden + q_dim + 2 kv_dim + q_dim
// + 2 ffn + 1) + n_out * (hidden + vocab) floats, a RoPE table of (max position + 1) *
// rotary_dim floats and one attention scratch per thread; buffers grow, never shrink.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "attention.hpp"
#include "detail/ops.hpp"
#include "gemm.hpp"
#include "linear.hpp"
#include "matrix.hpp"
#include "weights.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Bytes a forward pass allocated, by kind, at its peak (all of them are live at once).
struct memory_stats {
  std::size_t kv_bytes = 0;          // the KV it writes into: packed output, or the paged pool
  std::size_t activation_bytes = 0;  // residual stream, projections, MLP, RoPE table, logits
  std::size_t mask_bytes = 0;        // the dense mask (dense path only)
  std::size_t scratch_bytes = 0;     // per-thread attention tiles
  std::size_t peak_bytes = 0;        // the sum: the most the pass held at one time
};

namespace detail {

// Sets Eigen's and OpenMP's thread counts for one call, and restores them afterwards: oneDNN's
// GEMMs and our loops then use exactly the caller's count, with no oversubscription.
class thread_scope {
 public:
  explicit thread_scope(int requested) : n_(threads_for(requested)) {
#ifdef _OPENMP
    saved_omp_ = omp_get_max_threads();
    omp_set_num_threads(n_);
#endif
    saved_eigen_ = Eigen::nbThreads();
    Eigen::setNbThreads(n_);
  }
  ~thread_scope() {
    Eigen::setNbThreads(saved_eigen_);
#ifdef _OPENMP
    omp_set_num_threads(saved_omp_);
#endif
  }
  thread_scope(const thread_scope&) = delete;
  thread_scope& operator=(const thread_scope&) = delete;
  int n() const noexcept { return n_; }

 private:
  int n_ = 1, saved_eigen_ = 1;
#ifdef _OPENMP
  int saved_omp_ = 1;
#endif
};

using clock = std::chrono::steady_clock;
template <class F>
double timed(F&& f) {
  const auto t0 = clock::now();
  f();
  return std::chrono::duration<double>(clock::now() - t0).count();
}

inline memory_stats total_memory(std::size_t kv, std::pair<std::size_t, std::size_t> work,
                                 std::size_t mask) {
  memory_stats m;
  m.kv_bytes = kv;
  m.activation_bytes = work.first;
  m.mask_bytes = mask;
  m.scratch_bytes = work.second;
  m.peak_bytes = kv + work.first + mask + work.second;
  return m;
}

// The buffers of a forward pass, declared once (for_each_buffer): sized for a pass of n rows and
// n_out outputs, they are counted from that list (the report, and estimate_prefill_memory from
// shapes alone) and grown from it. A model keeps its workspace between passes, as engines keep
// their activation buffers: a fresh allocation per pass would pay its page faults every time.
class workspace {
 public:
  // Calls f(buffer, rows, cols) for every activation buffer of a pass.
  template <class F>
  void for_each_buffer(const config& c, std::size_t n, std::size_t n_out, F&& f) {
    const auto u = [](int v) { return static_cast<std::size_t>(v); };
    f(h_, n, u(c.hidden));                      // residual stream
    f(qkv_, n, u(c.q_dim() + 2 * c.kv_dim()));  // fused projection; Q after RoPE
    f(att_, n, u(c.q_dim()));                   // attention output
    f(gu_, n, 2 * u(c.ffn));                    // gate | up; SwiGLU over the gate half
    f(scale_, n, std::size_t{1});               // RMSNorm scale of each row
    f(last_, n_out, u(c.hidden));               // final-normed output rows
    f(logits_, n_out, u(c.vocab));              // their logits
  }

  // Bytes of a pass's activations (RoPE table, and with bf16 weights the rounded activations,
  // included) and per-thread attention scratch, for projections of type `weights` laid out for
  // `layout`, multiplied on `backend`, or held quantized (`quantized`: their scaled inputs and
  // decoded panels; with `int8` activations also their 8-bit copies, a byte and two block
  // floats per value of the widest input, with VNNI a lane sum per 4 values, and from
  // linear::int8_panel_rows rows their tiles and each thread's converted weight rows).
  std::pair<std::size_t, std::size_t> bytes(const config& c, std::size_t n, std::size_t n_out,
                                            std::int64_t max_pos, int n_threads,
                                            weight_type weights, gemm_backend backend,
                                            gemm_backend layout, bool quantized = false,
                                            bool int8 = false) {
    using prepack::detail::add;
    using prepack::detail::mul;
    std::size_t act = 0;
    for_each_buffer(c, n, n_out, [&](std::vector<float>&, std::size_t rows, std::size_t cols) {
      act = add(act, mul(mul(rows, cols, "activations"), sizeof(float), "activations"),
                "activations");
    });
    act = add(act,
              mul(static_cast<std::size_t>(max_pos + 1),
                  static_cast<std::size_t>(c.rotary_dim() / 2) * 2 * sizeof(float), "RoPE table"),
              "activations");
    const bool native = weights == weight_type::bf16 && bf16_path(backend).native;
    if (quantized) {
      // The normed inputs of Q | K | V and gate | up, scaled by the norm's weight.
      act = add(act,
                mul(mul(n, static_cast<std::size_t>(c.hidden), "scaled activations"), sizeof(float),
                    "scaled activations"),
                "activations");
      if (int8) {
        const std::size_t k = static_cast<std::size_t>(std::max({c.hidden, c.q_dim(), c.ffn}));
        const std::size_t values = mul(n, k, "int8 activations");  // k: whole 32-value blocks
        std::size_t bytes8 = add(values, values / 32 * 2 * sizeof(float), "int8 activations");
        if (detail::int8_rows::lane_sums) bytes8 = add(bytes8, values, "int8 activations");  // n4
#if PREPACK_GGML_INT8_PANEL
        // from linear::int8_panel_rows rows: the rows' tiles and each thread's converted rows
        if (static_cast<Eigen::Index>(n) >= linear::int8_panel_rows) {
          const auto rows = static_cast<std::int64_t>(n), cols = static_cast<std::int64_t>(k);
          bytes8 = add(bytes8, detail::int8_rows::tile_bytes(rows, cols), "int8 activations");
          bytes8 = add(bytes8,
                       mul(static_cast<std::size_t>(n_threads),
                           detail::int8_weight_rows::bytes_for(linear::int8_chunk, cols),
                           "int8 weight rows"),
                       "int8 activations");
        }
#endif
        act = add(act, bytes8, "activations");
      }
    } else if (weights == weight_type::bf16) {
      // Native: the activations as bf16. Emulated: rounded, as fp32.
      act = add(act,
                mul(mul(n, gemm_k(c), "bf16 activations"),
                    native ? sizeof(std::uint16_t) : sizeof(float), "bf16 activations"),
                "activations");
    }
    // fp32 on oneDNN's held layout: the down projection's strided input (the gate half of
    // gate | up) made dense.
    const bool eigen = resolve(backend) == gemm_backend::eigen;
    if (weights == weight_type::f32 && !eigen &&
        held_by_onednn(c.ffn, c.hidden, weight_type::f32, layout)) {
      act = add(act,
                mul(mul(n, static_cast<std::size_t>(c.ffn), "dense activations"), sizeof(float),
                    "dense activations"),
                "activations");
    }
    // Each thread's panel of weights widened to fp32, for the widest GEMM that widens: every
    // bf16 one on the emulated paths, and on the Eigen backend the fp32 ones oneDNN holds.
    // Quantized layers decode every panel (and from 9 to 255 rows multiply by tiles, with the
    // input transposed: linear::tile_scratch_floats).
    std::size_t transposed = 0;
    const auto panel = [&](Eigen::Index in, Eigen::Index out, weight_type t,
                           bool decodes = false) -> std::size_t {
      const bool widens =
          decodes ||
          (t == weight_type::bf16 ? !native
                                  : eigen && held_by_onednn(in, out, weight_type::f32, layout));
      if (!widens) return 0;
      const auto tiles = linear::tile_scratch_floats(in, out, static_cast<Eigen::Index>(n));
      transposed = std::max(transposed, tiles.first);
      return std::max(tiles.second, static_cast<std::size_t>(in) *
                                        static_cast<std::size_t>(linear::panel_cols(in, out)));
    };
    const auto ffn = static_cast<Eigen::Index>(c.ffn);
    std::size_t widest = std::max({panel(c.hidden, c.q_dim() + 2 * c.kv_dim(), weights, quantized),
                                   panel(c.q_dim(), c.hidden, weights, quantized),
                                   panel(c.hidden, 2 * ffn, weights, quantized),
                                   panel(ffn, c.hidden, weights, quantized)});
    if (!c.tied_embeddings) widest = std::max(widest, panel(c.hidden, c.vocab, weight_type::f32));
    act = add(act,
              mul(add(mul(static_cast<std::size_t>(n_threads), widest, "weight panels"), transposed,
                      "weight panels"),
                  sizeof(float), "weight panels"),
              "activations");
    const std::size_t scratch = static_cast<std::size_t>(n_threads) *
                                attention_scratch::bytes_for(tile_rows(c), c.head_size());
    return {act, scratch};
  }

  // Makes every buffer hold a pass of this shape (growing, never shrinking).
  void reserve(const config& c, std::size_t n, std::size_t n_out, std::int64_t max_pos,
               int n_threads) {
    for_each_buffer(c, n, n_out, [](std::vector<float>& buf, std::size_t rows, std::size_t cols) {
      if (buf.size() < rows * cols) buf.assign(rows * cols, 0.0f);
    });
    if (rope_max_ < max_pos || rope_.half != c.rotary_dim() / 2) {
      rope_ = make_rope_table(c.rotary_dim(), c.rope_theta, max_pos, c.rope_freq_factors);
      rope_max_ = max_pos;
    }
    while (scratch_.size() < static_cast<std::size_t>(n_threads)) {
      scratch_.emplace_back(tile_rows(c), c.head_size());
    }
  }

  static Eigen::Index tile_rows(const config& c) { return query_tile * (c.n_heads / c.n_kv_heads); }
  // The widest input of a projection (what a bf16 GEMM rounds per row).
  static std::size_t gemm_k(const config& c) {
    return static_cast<std::size_t>(std::max({c.hidden, c.q_dim(), c.ffn}));
  }

  using view = Eigen::Map<matrix>;
  view h(Eigen::Index n, Eigen::Index cols) { return {h_.data(), n, cols}; }
  view qkv(Eigen::Index n, Eigen::Index cols) { return {qkv_.data(), n, cols}; }
  view att(Eigen::Index n, Eigen::Index cols) { return {att_.data(), n, cols}; }
  view gu(Eigen::Index n, Eigen::Index cols) { return {gu_.data(), n, cols}; }
  view last(Eigen::Index n, Eigen::Index cols) { return {last_.data(), n, cols}; }
  view logits(Eigen::Index n, Eigen::Index cols) { return {logits_.data(), n, cols}; }
  float* scale() { return scale_.data(); }
  const rope_table& rope() const { return rope_; }
  attention_scratch& scratch(int thread) { return scratch_[static_cast<std::size_t>(thread)]; }
  gemm_scratch& gemm() { return gemm_; }

 private:
  std::vector<float> h_, qkv_, att_, gu_, scale_, last_, logits_;
  gemm_scratch gemm_;  // bf16 weights: the activations rounded for their GEMMs
  rope_table rope_;
  std::int64_t rope_max_ = -1;
  std::vector<attention_scratch> scratch_;
};

// A workspace and the lock that gives it to one pass at a time. A copied or moved model starts
// with an empty one of its own.
struct workspace_slot {
  std::mutex lock;
  workspace work;
  workspace_slot() = default;
  workspace_slot(const workspace_slot&) {}
  workspace_slot& operator=(const workspace_slot&) { return *this; }
};

}  // namespace detail
}  // namespace reference
PREPACK_NAMESPACE_END
