// prepack/ggml/arch/x86/dot_f32.hpp - fp32 dots straight from a row's blocks, in vectors
// (AVX2, AVX-512): the vector versions of ggml/quants.hpp's dot_f32_generic, for the types
// has_dot_f32 names, one function per type (or per two types whose blocks are laid out alike),
// named for it; dot_f32<T, M> at the end is the one place that says which computes which.
// Standard library and <immintrin.h> only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "simd.hpp"

PREPACK_NAMESPACE_BEGIN
namespace ggml {
namespace x86 {

// Dots straight from a row's blocks (decode at one to a few sequences): for each 32-value block
// of Q8_0, Q4_0 or Q4_1 (sub-block of Q4_K), y_i += d * (q . a_i), the int8 or nibble values
// widened to fp32 in registers and multiplied with the fp32 activations, never written out as fp32
// weights; Q6_K's 16-value groups are widened to their decoded values d sc (q - 32) in registers.
// The weight is ggml's value exactly; only the order of the fp32 roundings differs from decoding
// first (d applied to a block's sum rather than to each value; Q4_1's m and Q4_K's mins to the
// activations' block sums). Each accumulator is named at
// compile time (a register, not a stack slot indexed at run time) and summed as a tree. Built
// where the compiler targets AVX-512 or AVX2 with FMA and F16C.

/// Whether this build has a vector fp32 dot of T (dot_f32 below): Q5_K and Q3_K only where
/// values are looked up (512-bit vectors), Q5_0 and Q5_1 where blocks decode in vectors.
template <ggml_type T>
inline constexpr bool has_dot_f32 =
    PREPACK_GGML_FUSED &&
    (T == ggml_type::q8_0 || T == ggml_type::q4_0 || T == ggml_type::q4_1 || T == ggml_type::q4_k ||
     T == ggml_type::q6_k || T == ggml_type::iq4_nl || T == ggml_type::iq4_xs ||
     (PREPACK_GGML_AVX2 && (T == ggml_type::q5_0 || T == ggml_type::q5_1)) ||
     (PREPACK_GGML_LOOKUP && (T == ggml_type::q5_k || T == ggml_type::q3_k)));

#if PREPACK_GGML_LOOKUP
#if defined(__AVX512F__)
// The lookup dots (dot_f32 of the 4-bit formats where a vector holds 16 floats): the 16 values a
// block's nibbles can stand for decoded once into a vector as ggml's dequantize_row_* defines
// them (Q4_0 d (q - 8); Q4_1 d q + m; Q4_K d sc q - dmin m of each 32-value sub-block, the
// product and the min fused into one rounding), then 16 nibbles at a time looked up in it
// (vpermps) and multiplied with each activation row: no widening to fp32 and no scale per value,
// and the mins are in the values rather than a separate sum of the activations. Q5_K's 32
// values a sub-block (the nibble and a fifth bit) are looked up in two vectors (vpermi2ps),
// Q3_K's 8 a 16-value group (two bits and a high bit) in one. Four accumulators a row (the
// 16-value quarters of 64 values), summed as a tree. O(M k) each.

/// The lookup dots' M activation rows (lda apart) and their four accumulators a row. Each
/// kernel is flattened, so `u` is known at compile time and the accumulators stay in registers.
template <int M>
struct lookup_rows {
  std::int64_t lda;
  __m512 acc[M][4];

  explicit lookup_rows(std::int64_t lda_) noexcept : lda(lda_) {
    for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm512_setzero_ps();
  }
  // 16 indices (one a lane: permutexvar reads its low 4 bits) looked up in `values`, times
  // x[0..16) of each row, into accumulator u.
  void look(__m512i index, __m512 values, const float* x, int u) noexcept {
    add(_mm512_permutexvar_ps(index, values), x, u);
  }
  // 16 5-bit indices looked up in the 32 values [lo | hi] (vpermi2ps).
  void look32(__m512i index, __m512 lo, __m512 hi, const float* x, int u) noexcept {
    add(_mm512_permutex2var_ps(lo, index, hi), x, u);
  }
  void add(__m512 w, const float* x, int u) noexcept {
    for (int i = 0; i < M; ++i)
      acc[i][u] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + i * lda), acc[i][u]);
  }
  void sum(float* y) const noexcept {
    for (int i = 0; i < M; ++i) {
      y[i] = fused_sum(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3]));
    }
  }
};

inline __m512 lookup_iota() noexcept {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
// 16 nibble bytes widened one a lane: the low nibbles index as they are, the high ones
// shifted down (one widening for both, no masks).
inline __m512i lookup_bytes16(const unsigned char* q) noexcept {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
}
inline __m512i lookup_high(__m512i b) noexcept { return _mm512_srli_epi32(b, 4); }

/// Q4_K and Q5_K (their d, dmin and scales are laid out alike).
template <ggml_type T, int M>
__attribute__((flatten)) void dot_f32_lookup_q4_k_q5_k(const unsigned char* p, std::int64_t k,
                                                       const float* a, std::int64_t lda,
                                                       float* y) noexcept {
  static_assert(T == ggml_type::q4_k || T == ggml_type::q5_k);
  lookup_rows<M> r(lda);
  const __m512 iota = lookup_iota();
  constexpr bool q5 = T == ggml_type::q5_k;
  constexpr std::int64_t bytes = q5 ? sizeof(block_q5_k) : sizeof(block_q4_k);
  const __m512 iota16 = _mm512_add_ps(iota, _mm512_set1_ps(16.0f));
  const __m512i bit4 = _mm512_set1_epi32(16);
  // index bits 0-3 from n, bit 4 from t (bits above 4 are not read)
  const auto fifth = [&](__m512i n, __m512i t) {
    return _mm512_ternarylogic_epi32(bit4, t, n, 0xCA);
  };
  for (std::int64_t b = 0; b < k / 256; ++b, p += bytes) {
    // d sc_j (lanes 0-7) and -dmin m_j (8-15), each product rounded once (q4k_block_scales)
    alignas(64) float ds[16];
    const auto& b4 = block_at<block_q4_k>(p);  // Q5_K's d, dmin, scales are Q4_K's
    const auto& b5 = block_at<block_q5_k>(p);
    _mm512_store_ps(
        ds, _mm512_mul_ps(_mm512_insertf32x8(_mm512_set1_ps(fp16(b4.d.b)),
                                             _mm256_set1_ps(-fp16(b4.dmin.b)), 1),
                          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scale_bytes(b4.scales)))));
    const auto lane = [&](std::ptrdiff_t j) { return _mm512_set1_ps(ds[j]); };
    if (q5) {
      // dequantize_row_q5_K: value l of sub-block j is (its nibble | bit j of qh[l] << 4)
      // d sc_j - dmin m_j; t* hold qh[l] << 4 >> j, bit j at bit 4
      __m512i t0 = _mm512_slli_epi32(lookup_bytes16(b5.qh), 4),
              t1 = _mm512_slli_epi32(lookup_bytes16(b5.qh + 16), 4);
      for (std::ptrdiff_t c = 0; c < 4; ++c) {
        const unsigned char* nib = b5.qs + 32 * c;
        const float* x = a + b * 256 + c * 64;
        const __m512 d0 = lane(2 * c), m0 = lane(8 + 2 * c);
        const __m512 d1 = lane(2 * c + 1), m1 = lane(9 + 2 * c);
        const __m512 v0 = _mm512_fmadd_ps(d0, iota, m0), w0 = _mm512_fmadd_ps(d0, iota16, m0);
        const __m512 v1 = _mm512_fmadd_ps(d1, iota, m1), w1 = _mm512_fmadd_ps(d1, iota16, m1);
        const __m512i n0 = lookup_bytes16(nib), n1 = lookup_bytes16(nib + 16);
        r.look32(fifth(n0, t0), v0, w0, x, 0);
        r.look32(fifth(n1, t1), v0, w0, x + 16, 1);
        r.look32(fifth(lookup_high(n0), _mm512_srli_epi32(t0, 1)), v1, w1, x + 32, 2);
        r.look32(fifth(lookup_high(n1), _mm512_srli_epi32(t1, 1)), v1, w1, x + 48, 3);
        t0 = _mm512_srli_epi32(t0, 2);
        t1 = _mm512_srli_epi32(t1, 2);
      }
      continue;
    }
    for (std::ptrdiff_t c = 0; c < 4; ++c) {  // 32 bytes: sub-block 2c's low nibbles, 2c + 1's high
      const unsigned char* nib = b4.qs + 32 * c;
      const float* x = a + b * 256 + c * 64;
      const __m512 v0 = _mm512_fmadd_ps(lane(2 * c), iota, lane(8 + 2 * c));
      const __m512 v1 = _mm512_fmadd_ps(lane(2 * c + 1), iota, lane(9 + 2 * c));
      const __m512i n0 = lookup_bytes16(nib), n1 = lookup_bytes16(nib + 16);
      r.look(n0, v0, x, 0);
      r.look(n1, v0, x + 16, 1);
      r.look(lookup_high(n0), v1, x + 32, 2);
      r.look(lookup_high(n1), v1, x + 48, 3);
    }
  }
  r.sum(y);
}

/// Q3_K.
template <int M>
__attribute__((flatten)) void dot_f32_lookup_q3_k(const unsigned char* p, std::int64_t k,
                                                  const float* a, std::int64_t lda,
                                                  float* y) noexcept {
  lookup_rows<M> r(lda);
  // 256 values: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, d.
  // dequantize_row_q3_K: value l of 16-value group g (128-value half n = g / 8, j = g / 2 % 4)
  // is d (s_g - 32) (((q[32 n + l] >> 2 j) & 3) - (bit 4 n + j of hm[l] ? 0 : 4)): the 3-bit
  // index (q bits, high bit) looked up in d (s_g - 32) (index - 4), an 8-value table twice
  const __m512 centred = _mm512_sub_ps(
      _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7), _mm512_set1_ps(4.0f));
  const __m512i low2 = _mm512_set1_epi32(3);
  for (std::int64_t b = 0; b < k / 256; ++b, p += sizeof(block_q3_k)) {
    alignas(64) float dl[16];  // d (s_g - 32)
    detail::group_scales_q3_k(block_at<block_q3_k>(p), dl);
    // hm[l] << 2, so that bit 4 n + j lands on bit 2 after a right shift by 4 n + j
    const auto& blk = block_at<block_q3_k>(p);
    const __m512i h[2] = {_mm512_slli_epi32(lookup_bytes16(blk.hmask), 2),
                          _mm512_slli_epi32(lookup_bytes16(blk.hmask + 16), 2)};
    for (std::ptrdiff_t n = 0; n < 2; ++n) {
      const __m512i q[2] = {lookup_bytes16(blk.qs + 32 * n), lookup_bytes16(blk.qs + 16 + 32 * n)};
      // groups 8 n + 2 j + half, from bytes l (half 0) or l + 16 (half 1), into accumulator u
      const auto group = [&](int j, int half, int u) {
        const std::ptrdiff_t g = 8 * n + std::ptrdiff_t{2} * j + half;
        const __m512i index = _mm512_ternarylogic_epi32(
            low2, _mm512_srl_epi32(q[half], _mm_cvtsi32_si128(2 * j)),
            _mm512_srl_epi32(h[half], _mm_cvtsi32_si128(static_cast<int>(4 * n) + j)), 0xCA);
        r.look(index, _mm512_mul_ps(_mm512_set1_ps(dl[g]), centred), a + b * 256 + 16 * g, u);
      };
      for (int j = 0; j < 4; j += 2) {
        group(j, 0, 0);
        group(j, 1, 1);
        group(j + 1, 0, 2);
        group(j + 1, 1, 3);
      }
    }
  }
  r.sum(y);
}

/// IQ4_NL and IQ4_XS (the same 32-value groups of indices).
template <ggml_type T, int M>
__attribute__((flatten)) void dot_f32_lookup_iq4(const unsigned char* p, std::int64_t k,
                                                 const float* a, std::int64_t lda,
                                                 float* y) noexcept {
  static_assert(T == ggml_type::iq4_nl || T == ggml_type::iq4_xs);
  lookup_rows<M> r(lda);
  // IQ4_NL (18 bytes: d, 16 bytes of indices) and IQ4_XS's 32-value sub-blocks (scale d (ls
  // - 32)): the 16 values s kvalues_iq4nl[q], each product rounded once as decoding gives it;
  // even blocks (sub-blocks) into accumulators 0, 1, odd ones into 2, 3 (pairs a step: the
  // accumulators named at compile time)
  // (the zero-masked conversions: GCC 12 warns on the unmasked ones' undefined source once
  // the table's load is folded)
  const __m512 kv =
      _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepi8_epi32(0xFFFF, kvalues16()));
  for_iq4_blocks(T, p, k, [&](float s, const unsigned char* q, std::int64_t j, auto u) {
    constexpr int U = 2 * decltype(u)::value;
    const __m512 v = _mm512_mul_ps(_mm512_set1_ps(s), kv);
    const __m512i n = lookup_bytes16(q);
    r.look(n, v, a + j, U);
    r.look(lookup_high(n), v, a + j + 16, U + 1);
  });
  r.sum(y);
}

/// Q4_0 (18 bytes: d, 16 bytes) and Q4_1 (20: d, m, 16): value j < 16 byte j's low nibble,
/// j >= 16 byte j - 16's high one; even blocks into accumulators 0, 1, odd into 2, 3.
template <ggml_type T, int M>
__attribute__((flatten)) void dot_f32_lookup_q4_0_q4_1(const unsigned char* p, std::int64_t k,
                                                       const float* a, std::int64_t lda,
                                                       float* y) noexcept {
  static_assert(T == ggml_type::q4_0 || T == ggml_type::q4_1);
  lookup_rows<M> r(lda);
  constexpr bool q41 = T == ggml_type::q4_1;
  constexpr std::int64_t bytes = q41 ? sizeof(block_q4_1) : sizeof(block_q4_0);
  const __m512 iota = lookup_iota();
  const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
  for (std::int64_t b = 0; b < k / 32; ++b, p += bytes) {
    // Q4_1's d and nibbles are where Q4_0's are, past its m
    const __m512 d = _mm512_set1_ps(fp16(p));
    const __m512 v =
        q41 ? _mm512_fmadd_ps(d, iota, _mm512_set1_ps(fp16(block_at<block_q4_1>(p).m.b)))
            : _mm512_mul_ps(d, iota8);
    const unsigned char* q = q41 ? block_at<block_q4_1>(p).qs : block_at<block_q4_0>(p).qs;
    const __m512i n = lookup_bytes16(q);
    if (b % 2 == 0) {
      r.look(n, v, a + b * 32, 0);
      r.look(lookup_high(n), v, a + b * 32 + 16, 1);
    } else {
      r.look(n, v, a + b * 32, 2);
      r.look(lookup_high(n), v, a + b * 32 + 16, 3);
    }
  }
  r.sum(y);
}
#endif
#endif

#if PREPACK_GGML_FUSED
// The fused dots (AVX2, or AVX-512 where a type is not looked up): y[i] = a_i . row for M
// activation rows a[M][k] (lda), the row's values widened to fp32 in registers. Two
// accumulators a row, summed as a tree. O(M k) each.

/// Q6_K.
template <int M>
void dot_f32_q6_k(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
                  float* y) noexcept {
  fused_vec acc[M][2];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = fused_zero();
  const __m128i mask = _mm_set1_epi8(0x0F);
  // 256 values: 128 low nibbles, 64 2-bit highs, 16 int8 scales, d; value d sc_g (q - 32) for
  // 16-value groups g, each ds_g * (q - 32) exactly as decoding gives it (ds_g = d sc_g rounded
  // once), then dotted with each row.
  const __m128i three0 = _mm_set1_epi8(0x30), bias = _mm_set1_epi8(32);
  for (std::int64_t b = 0; b < k / 256; ++b, p += sizeof(block_q6_k)) {
    const auto& blk = block_at<block_q6_k>(p);
    float ds16[16];  // ds_g of the 16 groups, converted and multiplied 8 at a time
    const __m256 d = _mm256_set1_ps(fp16(blk.d.b));
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales));
    _mm256_storeu_ps(ds16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales))));
    _mm256_storeu_ps(
        ds16 + 8,
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scales, 8)))));
    for (std::ptrdiff_t half = 0; half < 2; ++half) {
      const unsigned char* ql = blk.ql + 64 * half;
      const unsigned char* qh = blk.qh + 32 * half;
      const float* sc = ds16 + 8 * half;
      const std::int64_t off = b * 256 + 128 * half;
      for (std::ptrdiff_t j = 0; j < 2; ++j) {  // values l in [16 j, 16 j + 16) of each quarter
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
        const auto group = [&](std::ptrdiff_t quarter, int u_acc) {
          fused_vec w[fused_per16];
          fused_widen16(_mm_sub_epi8(q6[quarter], bias), w);
          const fused_vec ds = fused_set1(sc[j + 2 * quarter]);
          for (int u = 0; u < fused_per16; ++u) w[u] = fused_mul(w[u], ds);
          const float* x = a + off + 32 * quarter + 16 * j;
          for (int i = 0; i < M; ++i) {
            for (std::ptrdiff_t u = 0; u < fused_per16; ++u) {
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
  for (int i = 0; i < M; ++i) y[i] = fused_sum(acc[i][0], acc[i][1]);
}

/// Q4_K: its values d sc q - dmin m of each 32-value sub-block enter as
/// d sc (q . a) - dmin m (sum of a).
template <int M>
void dot_f32_q4_k(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
                  float* y) noexcept {
  fused_vec acc[M][2];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = fused_zero();
  const __m128i mask = _mm_set1_epi8(0x0F);
  // 256 values: d, dmin, 12 scale bytes, 128 nibbles
  fused_vec mins[M][2];
  for (int i = 0; i < M; ++i) mins[i][0] = mins[i][1] = fused_zero();
  for (std::int64_t b = 0; b < k / 256; ++b, p += sizeof(block_q4_k)) {
    float ds[16];
    q4k_block_scales(p, ds);
    const unsigned char* nib = block_at<block_q4_k>(p).qs;
    for (std::ptrdiff_t c = 0; c < 4; ++c, nib += 32) {  // 64 values: low nibbles, then high ones
      const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
      const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib + 16));
      fused_vec lo[fused_per], hi[fused_per];
      fused_widen32(_mm_and_si128(b0, mask), _mm_and_si128(b1, mask), lo);
      fused_widen32(_mm_and_si128(_mm_srli_epi16(b0, 4), mask),
                    _mm_and_si128(_mm_srli_epi16(b1, 4), mask), hi);
      const fused_vec d1 = fused_set1(ds[2 * c]), d2 = fused_set1(ds[2 * c + 1]);
      const fused_vec n1 = fused_set1(ds[8 + 2 * c]), n2 = fused_set1(ds[9 + 2 * c]);
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
  for (int i = 0; i < M; ++i) y[i] = fused_sum(acc[i][0], acc[i][1]);
}

#if PREPACK_GGML_AVX2
/// Q5_0 and Q5_1.
template <ggml_type T, int M>
void dot_f32_q5_0_q5_1(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
                       float* y) noexcept {
  static_assert(T == ggml_type::q5_0 || T == ggml_type::q5_1);
  fused_vec acc[M][2];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = fused_zero();
  // 32 values: d, (Q5_1: m,) 32 high bits, 16 bytes of nibbles, as 32 bytes of 5-bit q
  // (q5_values32), widened: d (q - 16) . a (Q5_0), or d (q . a) + m (sum a) (Q5_1, the mins
  // into a chain of their own); even blocks into accumulator 0, odd ones into 1
  constexpr bool q51 = T == ggml_type::q5_1;
  fused_vec mins[M];
  for (int i = 0; i < M; ++i) mins[i] = fused_zero();
  const auto block = [&](const unsigned char* blk, const float* x, auto u_acc) {
    constexpr int U = decltype(u_acc)::value;
    const __m256i v = q51 ? q5_values32(block_at<block_q5_1>(blk).qh, block_at<block_q5_1>(blk).qs)
                          : q5_values32(block_at<block_q5_0>(blk).qh, block_at<block_q5_0>(blk).qs);
    fused_vec q[fused_per];
    fused_widen32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1), q);
    if (!q51) {
      for (std::ptrdiff_t u = 0; u < fused_per; ++u) q[u] = fused_sub(q[u], fused_set1(16.0f));
    }
    const fused_vec d = fused_set1(fp16(blk));
    for (int i = 0; i < M; ++i) acc[i][U] = fused_fma(fused_dot32(q, x + i * lda), d, acc[i][U]);
    if (q51) {
      const fused_vec m = fused_set1(fp16(block_at<block_q5_1>(blk).m.b));
      for (int i = 0; i < M; ++i) mins[i] = fused_fma(fused_sum32(x + i * lda), m, mins[i]);
    }
  };
  for_block_pairs(p, k / 32, q51 ? sizeof(block_q5_1) : sizeof(block_q5_0), 0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    block(q0, a + b * 32, std::integral_constant<int, 0>{});
                    if (!one) block(q1, a + (b + 1) * 32, std::integral_constant<int, 1>{});
                  });
  for (int i = 0; i < M; ++i) acc[i][1] = fused_add(acc[i][1], mins[i]);
  for (int i = 0; i < M; ++i) y[i] = fused_sum(acc[i][0], acc[i][1]);
}
#endif

/// IQ4_NL and IQ4_XS.
template <ggml_type T, int M>
void dot_f32_iq4(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
                 float* y) noexcept {
  static_assert(T == ggml_type::iq4_nl || T == ggml_type::iq4_xs);
  fused_vec acc[M][2];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = fused_zero();
  const __m128i mask = _mm_set1_epi8(0x0F);
  // 32 values (an IQ4_NL block, a sub-block of IQ4_XS): 16 bytes of indices looked up as
  // int8 kvalues_iq4nl by a byte shuffle, widened, then s (v . a); even blocks (sub-blocks)
  // into accumulator 0, odd ones into 1
  const __m128i table = kvalues16();
  for_iq4_blocks(T, p, k, [&](float s, const unsigned char* nib, std::int64_t j, auto acc_u) {
    constexpr int U = decltype(acc_u)::value;
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
    fused_vec lo[fused_per16], hi[fused_per16], v[fused_per];
    fused_widen16(_mm_shuffle_epi8(table, _mm_and_si128(bytes, mask)), lo);
    fused_widen16(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), mask)), hi);
    for (std::ptrdiff_t u = 0; u < fused_per16; ++u) {
      v[u] = lo[u];
      v[u + fused_per16] = hi[u];
    }
    const fused_vec d = fused_set1(s);
    for (int i = 0; i < M; ++i) {
      acc[i][U] = fused_fma(fused_dot32(v, a + j + i * lda), d, acc[i][U]);
    }
  });
  for (int i = 0; i < M; ++i) y[i] = fused_sum(acc[i][0], acc[i][1]);
}

/// Q4_1.
template <int M>
void dot_f32_q4_1(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
                  float* y) noexcept {
  fused_vec acc[M];
  for (int i = 0; i < M; ++i) acc[i] = fused_zero();
  const __m128i mask = _mm_set1_epi8(0x0F);
  // 32 values: d, m, 16 bytes (low nibbles j < 16, high ones j >= 16): d (q . a) + m (sum a),
  // into two accumulators each.
  fused_vec mins[M];
  for (int i = 0; i < M; ++i) mins[i] = fused_zero();
  for (std::int64_t b = 0; b < k / 32; ++b, p += sizeof(block_q4_1)) {
    const auto& blk = block_at<block_q4_1>(p);
    const fused_vec d = fused_set1(fp16(blk.d.b)), m = fused_set1(fp16(blk.m.b));
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
    fused_vec q[fused_per];
    fused_widen32(_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16(bytes, 4), mask), q);
    for (int i = 0; i < M; ++i) {
      const float* x = a + i * lda + b * 32;
      acc[i] = fused_fma(fused_dot32(q, x), d, acc[i]);
      mins[i] = fused_fma(fused_sum32(x), m, mins[i]);
    }
  }
  for (int i = 0; i < M; ++i) y[i] = fused_sum(acc[i], mins[i]);
}

/// Q8_0 and Q4_0 (d, then 32 int8 values or 16 bytes of nibbles).
template <ggml_type T, int M>
void dot_f32_q8_0_q4_0(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
                       float* y) noexcept {
  static_assert(T == ggml_type::q8_0 || T == ggml_type::q4_0);
  const __m128i mask = _mm_set1_epi8(0x0F);
  constexpr bool q8 = T == ggml_type::q8_0;
  constexpr std::int64_t block_bytes = q8 ? sizeof(block_q8_0) : sizeof(block_q4_0);
  // Two blocks a step into two accumulators each (indices known at compile time, so they
  // stay in registers), then an odd last block.
  const auto block = [&](const unsigned char* blk, const float* x0, fused_vec(&acc_i)[M]) {
    const fused_vec d = fused_set1(fp16(blk));
    fused_vec q[fused_per];
    if (q8) {
      for (std::ptrdiff_t u = 0; u < fused_per; ++u) {
        q[u] = fused_i8(block_at<block_q8_0>(blk).qs + u * fused_lanes);
      }
    } else {  // Q4_0: values j < 16 the low nibbles, j >= 16 the high ones, each minus 8
      const __m128i bytes =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(block_at<block_q4_0>(blk).qs));
      fused_widen32(_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16(bytes, 4), mask), q);
      const fused_vec eight = fused_set1(8.0f);
      for (int u = 0; u < fused_per; ++u) q[u] = fused_sub(q[u], eight);
    }
    for (int i = 0; i < M; ++i) acc_i[i] = fused_fma(fused_dot32(q, x0 + i * lda), d, acc_i[i]);
  };
  fused_vec even[M], odd[M];
  for (int i = 0; i < M; ++i) even[i] = odd[i] = fused_zero();
  for_block_pairs(p, k / 32, block_bytes, 0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    block(q0, a + b * 32, even);
                    if (!one) block(q1, a + (b + 1) * 32, odd);
                  });
  for (int i = 0; i < M; ++i) y[i] = fused_sum(even[i], odd[i]);
}

/// The vector fp32 dot of T (has_dot_f32<T>): y[i] = a_i . row for M activation rows a[M][k]
/// (lda) and one row of T, k a whole number of its blocks. The one place that names which
/// kernel computes which type: the lookup kernels where 512-bit vectors look values up, the
/// fused ones elsewhere. O(M k).
template <ggml_type T, int M>
void dot_f32(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
             float* y) noexcept {
  static_assert(has_dot_f32<T>, "dot_f32: a type this build has a vector kernel for");
  using t = ggml_type;
  if constexpr (T == t::q8_0 || (T == t::q4_0 && !PREPACK_GGML_LOOKUP)) {
    dot_f32_q8_0_q4_0<T, M>(p, k, a, lda, y);
  } else if constexpr (T == t::q6_k) {
    dot_f32_q6_k<M>(p, k, a, lda, y);
#if PREPACK_GGML_LOOKUP
  } else if constexpr (T == t::q4_0 || T == t::q4_1) {
    dot_f32_lookup_q4_0_q4_1<T, M>(p, k, a, lda, y);
  } else if constexpr (T == t::q4_k || T == t::q5_k) {
    dot_f32_lookup_q4_k_q5_k<T, M>(p, k, a, lda, y);
  } else if constexpr (T == t::q3_k) {
    dot_f32_lookup_q3_k<M>(p, k, a, lda, y);
  } else if constexpr (T == t::iq4_nl || T == t::iq4_xs) {
    dot_f32_lookup_iq4<T, M>(p, k, a, lda, y);
#else
  } else if constexpr (T == t::q4_1) {
    dot_f32_q4_1<M>(p, k, a, lda, y);
  } else if constexpr (T == t::q4_k) {
    dot_f32_q4_k<M>(p, k, a, lda, y);
  } else if constexpr (T == t::iq4_nl || T == t::iq4_xs) {
    dot_f32_iq4<T, M>(p, k, a, lda, y);
#endif
#if PREPACK_GGML_AVX2
  } else if constexpr (T == t::q5_0 || T == t::q5_1) {
    dot_f32_q5_0_q5_1<T, M>(p, k, a, lda, y);
#endif
  }
}
#endif

}  // namespace x86
}  // namespace ggml
PREPACK_NAMESPACE_END
