// prepack/reference/quantized.hpp - a projection's weights held as the checkpoint stores them
// (ggml's blocks: Q8_0, Q4_0, the K-quants, F16, ...), rows of output features, decoded a few
// rows at a time inside the GEMM exactly as ggml defines each type (checkpoint/quant.hpp), never
// as a whole fp32 copy. A Q4_K_M model so takes about the file's size instead of 4 bytes a weight.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../checkpoint/quant.hpp"
#include "../detail/checked.hpp"
#include "../error.hpp"
#include "matrix.hpp"

#if defined(__F16C__) && defined(__FMA__) && (defined(__AVX512F__) || defined(__AVX2__))
#include <immintrin.h>
#define PREPACK_FUSED_DOT 1
#else
#define PREPACK_FUSED_DOT 0
#endif

PREPACK_NAMESPACE_BEGIN
namespace reference {
namespace detail {

// Dots straight from a row's blocks (decode at one to a few sequences): for each 32-value block
// of Q8_0 or Q4_0 (sub-block of Q4_K), y_i += d * (q . a_i), the int8 or nibble values widened
// to fp32 in registers and multiplied with the fp32 activations, never written out as fp32
// weights; Q6_K's 16-value groups are widened to their decoded values d sc (q - 32) in registers.
// The weight is ggml's value exactly; only the order of the fp32 roundings differs from decoding
// first (d applied to a block's sum rather than to each value). Each accumulator is named at
// compile time (a register, not a stack slot indexed at run time) and summed as a tree. Built
// where the compiler targets AVX-512 or AVX2 with FMA and F16C; elsewhere rows are decoded,
// then dotted.
#if PREPACK_FUSED_DOT
inline float fp16_scale(const unsigned char* p) noexcept {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | (p[1] << 8)));
}
#if defined(__AVX512F__)
using fused_vec = __m512;
constexpr int fused_lanes = 16;
inline fused_vec fused_zero() noexcept { return _mm512_setzero_ps(); }
inline fused_vec fused_load(const float* x) noexcept { return _mm512_loadu_ps(x); }
inline fused_vec fused_fma(fused_vec a, fused_vec b, fused_vec c) noexcept {
  return _mm512_fmadd_ps(a, b, c);
}
inline fused_vec fused_mul(fused_vec a, fused_vec b) noexcept { return _mm512_mul_ps(a, b); }
inline fused_vec fused_sub(fused_vec a, fused_vec b) noexcept { return _mm512_sub_ps(a, b); }
inline fused_vec fused_add(fused_vec a, fused_vec b) noexcept { return _mm512_add_ps(a, b); }
inline fused_vec fused_set1(float v) noexcept { return _mm512_set1_ps(v); }
inline float fused_sum(fused_vec a, fused_vec b) noexcept {
  // A tree of log2(16) dependent adds over whole-register shuffles (the zero-masked forms:
  // GCC 12 warns on the unmasked ones' undefined source, and on extract / reduce_add).
  const __mmask16 all = 0xFFFF;
  __m512 s = _mm512_add_ps(a, b);
  s = _mm512_add_ps(s, _mm512_maskz_shuffle_f32x4(all, s, s, 0x4E));  // halves swapped
  s = _mm512_add_ps(s, _mm512_maskz_shuffle_f32x4(all, s, s, 0xB1));  // quarters, in pairs
  s = _mm512_add_ps(s, _mm512_maskz_permute_ps(all, s, 0x4E));
  s = _mm512_add_ps(s, _mm512_maskz_permute_ps(all, s, 0xB1));
  return _mm512_cvtss_f32(s);
}
// 16 int8 / uint8 values at p as 16 floats.
inline fused_vec fused_i8(const unsigned char* p) noexcept {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline fused_vec fused_u8(__m128i v) noexcept {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}
#else
using fused_vec = __m256;
constexpr int fused_lanes = 8;
inline fused_vec fused_zero() noexcept { return _mm256_setzero_ps(); }
inline fused_vec fused_load(const float* x) noexcept { return _mm256_loadu_ps(x); }
inline fused_vec fused_fma(fused_vec a, fused_vec b, fused_vec c) noexcept {
  return _mm256_fmadd_ps(a, b, c);
}
inline fused_vec fused_mul(fused_vec a, fused_vec b) noexcept { return _mm256_mul_ps(a, b); }
inline fused_vec fused_sub(fused_vec a, fused_vec b) noexcept { return _mm256_sub_ps(a, b); }
inline fused_vec fused_add(fused_vec a, fused_vec b) noexcept { return _mm256_add_ps(a, b); }
inline fused_vec fused_set1(float v) noexcept { return _mm256_set1_ps(v); }
inline float fused_sum(fused_vec a, fused_vec b) noexcept {
  const __m256 s = _mm256_add_ps(a, b);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}
inline fused_vec fused_i8(const unsigned char* p) noexcept {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline fused_vec fused_u8(__m128i v) noexcept {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}
#endif

constexpr int fused_per = 32 / fused_lanes;    // vectors in 32 values
constexpr int fused_per16 = 16 / fused_lanes;  // vectors in 16 values

// 16 int8 values as fused_per16 vectors of floats.
inline void fused_widen16(__m128i v, fused_vec (&q)[fused_per16]) noexcept {
#if defined(__AVX512F__)
  q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
#else
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
#endif
}

// 32 values 0..255 (v0's 16 bytes, then v1's) as fused_per vectors of floats.
inline void fused_widen32(__m128i v0, __m128i v1, fused_vec (&q)[fused_per]) noexcept {
  if constexpr (fused_lanes == 16) {
    q[0] = fused_u8(v0);
    q[1] = fused_u8(v1);
  } else {
    q[0] = fused_u8(v0);
    q[1] = fused_u8(_mm_srli_si128(v0, 8));
    q[2] = fused_u8(v1);
    q[3] = fused_u8(_mm_srli_si128(v1, 8));
  }
}

// sum_u q[u] * x[u lanes ...] over 32 values, lane-wise.
inline fused_vec fused_dot32(const fused_vec (&q)[fused_per], const float* x) noexcept {
  fused_vec t = fused_mul(q[0], fused_load(x));
  for (int u = 1; u < fused_per; ++u) t = fused_fma(q[u], fused_load(x + u * fused_lanes), t);
  return t;
}

// x's 32 values summed lane-wise.
inline fused_vec fused_sum32(const float* x) noexcept {
  fused_vec t = fused_load(x);
  for (int u = 1; u < fused_per; ++u) t = fused_add(t, fused_load(x + u * fused_lanes));
  return t;
}

// y[i] = a_i . row for M activation rows a[M][k] (lda) and one row of `type` (Q8_0, Q4_0: k a
// multiple of 32; Q4_K, Q6_K: of 256). Q4_K's values d sc q - dmin m of each 32-value sub-block
// enter as d sc (q . a) - dmin m (sum of a). O(M k).
template <int M>
void fused_dot(checkpoint::ggml_type type, const unsigned char* p, std::int64_t k, const float* a,
               std::int64_t lda, float* y) noexcept {
  fused_vec acc[M][2];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = fused_zero();
  const __m128i mask = _mm_set1_epi8(0x0F);
  if (type == checkpoint::ggml_type::q6_k) {  // 256 values: 128 low nibbles, 64 2-bit highs,
    // 16 int8 scales, d; value d sc_g (q - 32) for 16-value groups g, each ds_g * (q - 32)
    // exactly as decoding gives it (ds_g = d sc_g rounded once), then dotted with each row.
    const __m128i three0 = _mm_set1_epi8(0x30), bias = _mm_set1_epi8(32);
    for (std::int64_t b = 0; b < k / 256; ++b, p += 210) {
      const float d = fp16_scale(p + 208);
      const auto* scales = reinterpret_cast<const std::int8_t*>(p + 192);
      for (int half = 0; half < 2; ++half) {
        const unsigned char* ql = p + 64 * half;
        const unsigned char* qh = p + 128 + 32 * half;
        const std::int8_t* sc = scales + 8 * half;
        const std::int64_t off = b * 256 + 128 * half;
        for (int j = 0; j < 2; ++j) {  // values l in [16 j, 16 j + 16) of each quarter
          const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * j));
          const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 32 + 16 * j));
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * j));
          const __m128i q6[4] = {
              _mm_or_si128(_mm_and_si128(lo, mask), _mm_and_si128(_mm_slli_epi16(h, 4), three0)),
              _mm_or_si128(_mm_and_si128(hi, mask), _mm_and_si128(_mm_slli_epi16(h, 2), three0)),
              _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lo, 4), mask), _mm_and_si128(h, three0)),
              _mm_or_si128(_mm_and_si128(_mm_srli_epi16(hi, 4), mask),
                           _mm_and_si128(_mm_srli_epi16(h, 2), three0))};
          // Quarters 0 and 2 into one accumulator, 1 and 3 into another (indices known at
          // compile time, so they stay in registers).
          const auto group = [&](int quarter, int u_acc) {
            fused_vec w[fused_per16];
            fused_widen16(_mm_sub_epi8(q6[quarter], bias), w);
            const fused_vec ds = fused_set1(d * static_cast<float>(sc[j + 2 * quarter]));
            for (int u = 0; u < fused_per16; ++u) w[u] = fused_mul(w[u], ds);
            const float* x = a + off + 32 * quarter + 16 * j;
            for (int i = 0; i < M; ++i) {
              for (int u = 0; u < fused_per16; ++u) {
                acc[i][u_acc] =
                    fused_fma(w[u], fused_load(x + i * lda + u * fused_lanes), acc[i][u_acc]);
              }
            }
          };
          group(0, 0);
          group(1, 1);
          group(2, 0);
          group(3, 1);
        }
      }
    }
  } else if (type == checkpoint::ggml_type::q4_k) {
    // 256 values: d, dmin, 12 scale bytes, 128 nibbles
    fused_vec mins[M][2];
    for (int i = 0; i < M; ++i) mins[i][0] = mins[i][1] = fused_zero();
    for (std::int64_t b = 0; b < k / 256; ++b, p += 144) {
      const float d = fp16_scale(p), dmin = fp16_scale(p + 2);
      const unsigned char* sc = p + 4;
      const unsigned char* nib = p + 16;
      for (int c = 0; c < 4; ++c, nib += 32) {  // 64 values: low nibbles, then high ones
        const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
        const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib + 16));
        fused_vec lo[fused_per], hi[fused_per];
        fused_widen32(_mm_and_si128(b0, mask), _mm_and_si128(b1, mask), lo);
        fused_widen32(_mm_and_si128(_mm_srli_epi16(b0, 4), mask),
                      _mm_and_si128(_mm_srli_epi16(b1, 4), mask), hi);
        unsigned s1, m1, s2, m2;
        checkpoint::detail::scale_min_k4(2 * c, sc, s1, m1);
        checkpoint::detail::scale_min_k4(2 * c + 1, sc, s2, m2);
        const fused_vec d1 = fused_set1(d * static_cast<float>(s1));
        const fused_vec d2 = fused_set1(d * static_cast<float>(s2));
        const fused_vec n1 = fused_set1(-dmin * static_cast<float>(m1));
        const fused_vec n2 = fused_set1(-dmin * static_cast<float>(m2));
        for (int i = 0; i < M; ++i) {  // four independent chains, not one of four FMAs
          const float* x = a + i * lda + b * 256 + c * 64;
          acc[i][0] = fused_fma(fused_dot32(lo, x), d1, acc[i][0]);
          acc[i][1] = fused_fma(fused_dot32(hi, x + 32), d2, acc[i][1]);
          mins[i][0] = fused_fma(fused_sum32(x), n1, mins[i][0]);
          mins[i][1] = fused_fma(fused_sum32(x + 32), n2, mins[i][1]);
        }
      }
    }
    for (int i = 0; i < M; ++i) {
      acc[i][0] = fused_add(acc[i][0], mins[i][0]);
      acc[i][1] = fused_add(acc[i][1], mins[i][1]);
    }
  } else {
    const bool q8 = type == checkpoint::ggml_type::q8_0;
    const std::int64_t block_bytes = q8 ? 34 : 18;
    // Two blocks a step into two accumulators each (indices known at compile time, so they
    // stay in registers), then an odd last block.
    const auto block = [&](const unsigned char* blk, const float* x0, fused_vec(&acc_i)[M]) {
      const fused_vec d = fused_set1(fp16_scale(blk));
      fused_vec q[fused_per];
      if (q8) {
        for (int u = 0; u < fused_per; ++u) q[u] = fused_i8(blk + 2 + u * fused_lanes);
      } else {  // Q4_0: values j < 16 the low nibbles, j >= 16 the high ones, each minus 8
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        fused_widen32(_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16(bytes, 4), mask), q);
        const fused_vec eight = fused_set1(8.0f);
        for (int u = 0; u < fused_per; ++u) q[u] = fused_sub(q[u], eight);
      }
      for (int i = 0; i < M; ++i) acc_i[i] = fused_fma(fused_dot32(q, x0 + i * lda), d, acc_i[i]);
    };
    fused_vec even[M], odd[M];
    for (int i = 0; i < M; ++i) even[i] = odd[i] = fused_zero();
    const std::int64_t nb = k / 32;
    std::int64_t b = 0;
    for (; b + 2 <= nb; b += 2, p += 2 * block_bytes) {
      block(p, a + b * 32, even);
      block(p + block_bytes, a + (b + 1) * 32, odd);
    }
    if (b < nb) block(p, a + b * 32, even);
    for (int i = 0; i < M; ++i) {
      acc[i][0] = even[i];
      acc[i][1] = odd[i];
    }
  }
  for (int i = 0; i < M; ++i) y[i] = fused_sum(acc[i][0], acc[i][1]);
}
#endif

/// Whether rows of `type` dot straight from their blocks on this build (fused_dot).
constexpr bool fused_dot_type(checkpoint::ggml_type type) noexcept {
  return PREPACK_FUSED_DOT &&
         (type == checkpoint::ggml_type::q8_0 || type == checkpoint::ggml_type::q4_0 ||
          type == checkpoint::ggml_type::q4_k || type == checkpoint::ggml_type::q6_k);
}

}  // namespace detail

/// `rows` output features of `cols` inputs each ([out][in], torch's order: the transpose of the
/// model's semantic [in][out] form), each row `row_bytes` bytes of ggml's blocks of `type`.
/// Empty (rows 0) where a projection is held in fp32 instead.
struct quantized_matrix {
  checkpoint::ggml_type type = checkpoint::ggml_type::f32;
  Eigen::Index rows = 0, cols = 0;
  std::size_t row_bytes = 0;
  std::vector<unsigned char> bytes;  // [rows][row_bytes]

  bool empty() const noexcept { return rows == 0; }
  const char* type_name() const noexcept { return checkpoint::ggml_type_name(type); }

  /// rows x cols values of `type` copied from src (n bytes, the rows one after another). Throws
  /// prepack::error naming `what` for a type prepack does not decode, a row that is not a whole
  /// number of blocks, or n other than the rows' bytes. Cost: one copy of n bytes.
  static quantized_matrix from_bytes(checkpoint::ggml_type type, Eigen::Index rows,
                                     Eigen::Index cols, const unsigned char* src, std::size_t n,
                                     const std::string& what) {
    using prepack::detail::require;
    const auto block = checkpoint::dequantizable_block(type);
    const char* name = checkpoint::ggml_type_name(type);
    require(block.has_value(), what, ": type ", name != nullptr ? name : "?", " (",
            static_cast<std::uint32_t>(type), ") cannot be decoded");
    require(rows > 0 && cols > 0, what, ": shape ", rows, " x ", cols);
    require(static_cast<std::uint64_t>(cols) % block->elements == 0, what, ": rows of ", cols,
            " values are not a whole number of ", name, "'s ", block->elements, "-value blocks");
    quantized_matrix q;
    q.type = type;
    q.rows = rows;
    q.cols = cols;
    q.row_bytes =
        static_cast<std::size_t>(static_cast<std::uint64_t>(cols) / block->elements * block->bytes);
    const std::size_t total =
        prepack::detail::mul(q.row_bytes, static_cast<std::size_t>(rows), "quantized weights");
    require(n == total, what, ": ", n, " bytes, expected ", total, " (", rows, " rows of ",
            q.row_bytes, " bytes)");
    q.bytes.assign(src, src + n);
    return q;
  }

  /// An fp32 matrix in the model's [in][out] form as rows of type F32 (a transposed copy), to
  /// fuse beside quantized rows.
  static quantized_matrix from_fp32(const matrix& in_out) {
    quantized_matrix q;
    q.type = checkpoint::ggml_type::f32;
    q.rows = in_out.cols();
    q.cols = in_out.rows();
    q.row_bytes = static_cast<std::size_t>(q.cols) * sizeof(float);
    q.bytes.resize(q.row_bytes * static_cast<std::size_t>(q.rows));
    const matrix t = in_out.transpose();
    std::memcpy(q.bytes.data(), t.data(), q.bytes.size());
    return q;
  }

  /// Rows [r0, r0 + n) decoded to fp32 into out[n][cols] as ggml defines the type (its
  /// products free to fuse with the additions that follow: checkpoint::dequantize_fast, within
  /// one fp32 rounding of ggml's reference values). Cost: n x cols values decoded; no
  /// allocation, no throw.
  void decode_rows(Eigen::Index r0, Eigen::Index n, float* out) const noexcept {
    for (Eigen::Index r = 0; r < n; ++r) {
      checkpoint::dequantize_fast(type, bytes.data() + static_cast<std::size_t>(r0 + r) * row_bytes,
                                  static_cast<std::size_t>(cols), out + r * cols);
    }
  }

  /// y[i] = a_i . row r for M activation rows a[M][cols] (lda), straight from the row's blocks,
  /// where detail::fused_dot_type(type) (else a caller decodes the row first). O(M cols).
  template <int M>
  void dot_row(Eigen::Index r, const float* a, Eigen::Index lda, float* y) const noexcept {
#if PREPACK_FUSED_DOT
    detail::fused_dot<M>(type, bytes.data() + static_cast<std::size_t>(r) * row_bytes, cols, a, lda,
                         y);
#else
    (void)r, (void)a, (void)lda, (void)y;
#endif
  }

  /// The same rows reordered: row i of the result is row from[i] of this (a row is one output
  /// feature, whole blocks, so a permutation of features moves bytes only). Throws
  /// prepack::error for a mapping of another length or an index out of range.
  quantized_matrix permuted_rows(const std::vector<std::size_t>& from) const {
    prepack::detail::require(from.size() == static_cast<std::size_t>(rows),
                             "permuted_rows: ", from.size(), " indices for ", rows, " rows");
    quantized_matrix q = *this;
    for (std::size_t i = 0; i < from.size(); ++i) {
      prepack::detail::require(from[i] < from.size(), "permuted_rows: index ", i, " = ", from[i],
                               " outside ", rows, " rows");
      std::copy_n(bytes.data() + from[i] * row_bytes, row_bytes, q.bytes.data() + i * row_bytes);
    }
    return q;
  }
};

/// The projections of one layer a source hands over in the file's encoding; each one non-empty
/// here stands in for the fp32 matrix of the same name in layer_weights (then empty).
struct quantized_projections {
  quantized_matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  bool any() const noexcept {
    return !(wq.empty() && wk.empty() && wv.empty() && wo.empty() && w_gate.empty() &&
             w_up.empty() && w_down.empty());
  }
};

}  // namespace reference
PREPACK_NAMESPACE_END
