// prepack/reference/quantized_linear.hpp - a linear layer whose weights are ggml's quantized
// blocks, held as a checkpoint stores them (quantized_matrix segments of output rows, each of its
// own type), multiplied straight from them: their rows' dots, decoded panels in register tiles or
// fp32 GEMMs, or integer dots with 8-bit activations. linear.hpp's `linear` holds one of these or
// a dense_linear.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../ggml/kernels.hpp"
#include "gemm.hpp"
#include "matrix.hpp"
#include "quantized.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// One linear layer's quantized weights: the output rows, as a checkpoint stores them
/// (quantized_matrix segments of output rows, each of its own ggml type: fused Q | K | V of a
/// Q4_K_M file mixes Q4_K and Q6_K), the bytes of the file and nothing more, [out][in]
/// (transposed: y = x W^T). Every call dots the rows straight from their blocks (up to 8
/// activation rows, the types that can) or decodes a panel of output rows at a time into
/// per-thread fp32 scratch, exactly as ggml defines the type, and multiplies it in register
/// tiles (9-255 rows) or fp32 GEMMs over fp32 activations (so the function is that of the
/// widened weights, within fp32 rounding); or, opted into with `int8_activations` where every
/// segment's type has integer dots (detail::int8_dot_type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q3_K,
/// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), dotted in integers with the activations quantized to 8
/// bits per 32-value block (detail::int8_rows: llama.cpp's way, within the bound stated there,
/// each row's result independent of the rows beside it). A layer may scale its input's columns
/// first (`input_scale`: the RMSNorm weight that fp32 layers fold into their rows, which
/// quantized rows cannot absorb exactly). Always holds at least one row. Cost of building: the
/// segments are moved in.
class quantized_linear {
 public:
  /// A quantized layer: the segments' rows, one after another, are the output features
  /// ([out][in], so transposed() is true); y = (x . input_scale) W^T, input_scale empty or [in].
  /// Throws prepack::error naming the segment whose width differs from the first's, no
  /// segments, or an input scale of another length.
  quantized_linear(std::vector<quantized_matrix> segments, vector input_scale,
                   bool int8_activations = false)
      : q_(std::move(segments)), input_scale_(std::move(input_scale)) {
    prepack::detail::require(!q_.empty() && !q_[0].empty(), "quantized linear: no quantized rows");
    cols_ = q_[0].cols;
    for (std::size_t i = 0; i < q_.size(); ++i) {
      prepack::detail::require(q_[i].cols == cols_ && !q_[i].empty(), "quantized linear: segment ",
                               i, " (", q_[i].type_name(), ") is ", q_[i].rows, " x ", q_[i].cols,
                               ", the layer's rows are ", cols_, " wide");
      q_start_.push_back(rows_);
      rows_ += q_[i].rows;
    }
    prepack::detail::require(input_scale_.size() == 0 || input_scale_.size() == cols_,
                             "quantized linear: input scale of ", input_scale_.size(), " for ",
                             cols_, " inputs");
    int8_ = int8_activations && cols_ % 32 == 0 &&
            std::all_of(q_.begin(), q_.end(),
                        [](const quantized_matrix& m) { return detail::int8_dot_type(m.type); });
  }
  Eigen::Index in() const noexcept { return cols_; }
  Eigen::Index out() const noexcept { return rows_; }
  /// Whether this layer dots its rows with 8-bit activations (asked for, and every segment's
  /// type has integer dots); else its function is that of the widened weights.
  bool int8_activations() const noexcept { return int8_; }
  const std::vector<quantized_matrix>& segments() const noexcept { return q_; }
  const vector& input_scale() const noexcept { return input_scale_; }
  /// The weights as fp32, [out][in], the input scale not applied: a copy (in out floats), for
  /// inspection and tests.
  matrix widened() const {
    matrix m(rows_, cols_);
    decode_rows(0, rows_, m.data(), false);
    return m;
  }
  /// Bytes held: the blocks and the input scale.
  std::size_t bytes() const noexcept {
    std::size_t b = static_cast<std::size_t>(input_scale_.size()) * sizeof(float);
    for (const quantized_matrix& q : q_) b += q.bytes.size();
    return b;
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

  /// c[m][out] (ldc) = a[m][in] (lda) * W^T, or += with `accumulate`. 2 m in out FLOPs, and
  /// in out decodings of the weights on the paths that decode (up to once per call): integer
  /// dots (int8 activations), register tiles (dot_rows < m < wide_rows, where they pay), the
  /// rows' own dots and decoded rows (m <= dot_rows), else panel GEMMs on backend `backend`.
  /// No allocation once `scratch` has grown. Throws what resolve() throws.
  void apply(gemm_backend backend, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
             Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    if (m == 0) return;
    const gemm_backend be = resolve(backend);
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
  }

 private:
  static constexpr Eigen::Index wide_rows = detail::wide_rows;

  // Decoded rows dotted with the activations (m <= dot_rows), else panel GEMMs over decoded
  // panels (detail::panel_gemm: on all threads per GEMM from wide_rows rows, else each thread's
  // GEMM on Eigen).
  void apply_panels(gemm_backend be, Eigen::Index m, const float* a, Eigen::Index lda, float* c,
                    Eigen::Index ldc, bool accumulate, gemm_scratch& scratch) const {
    const Eigen::Index k = in(), n = out();
    const float* x = a;
    Eigen::Index ldx = lda;
    if (input_scale_.size() > 0) {  // the norm's weight on the input
      x = scaled_input(m, a, lda, scratch);
      ldx = k;
    }
    const Eigen::Index nb = m < wide_rows ? small_panel_cols(k, n) : panel_cols(k, n);
    const auto decode = [this](Eigen::Index c0, Eigen::Index w, float* panel, bool parallel) {
      decode_rows(c0, w, panel, parallel);
    };
    if (m > dot_rows) {
      detail::panel_gemm(be, gemm_backend::eigen, m, x, ldx, k, n, nb, true, decode, c, ldc,
                         accumulate, scratch.panels);
      return;
    }
    const Eigen::Index panels = (n + nb - 1) / nb;
    const int threads = threads_for(0);
    // A thread's scratch: a panel [nb][k] (nb >= 16), of which the dots use four rows [4][k].
    const std::size_t per_thread = static_cast<std::size_t>(k) * static_cast<std::size_t>(nb);
    if (scratch.panels.size() < per_thread * static_cast<std::size_t>(threads)) {
      scratch.panels.resize(per_thread * static_cast<std::size_t>(threads));
    }
    float* panel_base = scratch.panels.data();
    // Decode (a few sequences): rows of the types that dot straight from their blocks
    // (ggml::kernels(type).dot_f32: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, IQ4_NL, IQ4_XS on
    // AVX2 / AVX-512 builds, Q5_K, Q3_K on AVX-512) are never widened when up to fused_rows
    // activation rows multiply (fused_block rows a pass over a row, which stays in L1 between
    // passes: at 8 rows 1.1-1.8x faster than decoding it, at 16 up to 1.8x slower, measured on the
    // large model's files); the others are decoded four rows at a time into the thread's
    // cache-resident rows and dotted with every activation row, dot_mr rows at a time in registers.
    // Nothing is written to a panel and read back, or packed for a GEMM.
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

  std::vector<quantized_matrix> q_;    // the output rows, segment after segment
  std::vector<Eigen::Index> q_start_;  // each segment's first output row
  vector input_scale_;                 // [in] multiplying the input, or empty
  Eigen::Index rows_ = 0, cols_ = 0;   // out, in
  bool int8_ = false;                  // rows dotted with 8-bit activations
};

}  // namespace reference
PREPACK_NAMESPACE_END
