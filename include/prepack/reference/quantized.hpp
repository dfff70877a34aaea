// prepack/reference/quantized.hpp - a projection's weights held as the checkpoint stores them
// (ggml's blocks: Q8_0, Q4_0, the K-quants, F16, ...), rows of output features, decoded a few
// rows at a time inside the GEMM exactly as ggml defines each type (checkpoint/quant.hpp), never
// as a whole fp32 copy. A Q4_K_M model so takes about the file's size instead of 4 bytes a weight.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
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
// fused_dot looks values up (fused_dot_lookup) where a vector holds 16 floats.
#if PREPACK_FUSED_DOT && defined(__AVX512F__)
#define PREPACK_FUSED_LOOKUP 1
#else
#define PREPACK_FUSED_LOOKUP 0
#endif

PREPACK_NAMESPACE_BEGIN
namespace reference {
namespace detail {

// The walk of the 32-value block formats' kernels over a row at p (`bytes` a block, nb
// blocks): pair(q0, q1, b, one) for blocks b and b + 1 at q0 and q1 from block b0 on, two a step
// (a kernel puts the even block into one accumulator, the odd one into another), then an odd
// last block alone (q1 = q0, one true).
template <class Pair>
inline void for_block_pairs(const unsigned char* p, std::int64_t nb, std::int64_t bytes,
                            std::int64_t b0, Pair&& pair) {
  std::int64_t b = b0;
  for (; b + 2 <= nb; b += 2) pair(p + b * bytes, p + (b + 1) * bytes, b, false);
  if (b < nb) pair(p + b * bytes, p + b * bytes, b, true);
}

// d (s_g - 32) of the Q3_K block at p for its 16 value groups g (dequantize_row_q3_K's dl, one
// rounding each): the 6-bit s_g unpacked from 12 bytes as ggml's kmask1 / kmask2 code does.
inline void q3k_group_scales(const unsigned char* p, float (&dl)[16]) noexcept {
  std::uint32_t aux[4];
  std::memcpy(aux, p + 96, 12);
  const std::uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & 0x0f0f0f0fu) | (((tmp >> 4) & 0x03030303u) << 4);
  aux[3] = ((aux[1] >> 4) & 0x0f0f0f0fu) | (((tmp >> 6) & 0x03030303u) << 4);
  aux[0] = (aux[0] & 0x0f0f0f0fu) | ((tmp & 0x03030303u) << 4);
  aux[1] = (aux[1] & 0x0f0f0f0fu) | (((tmp >> 2) & 0x03030303u) << 4);
  unsigned char sc[16];
  std::memcpy(sc, aux, 16);
  const float d = checkpoint::detail::fp16(p + 108);
  for (int g = 0; g < 16; ++g) dl[g] = d * static_cast<float>(static_cast<int>(sc[g]) - 32);
}

// Dots straight from a row's blocks (decode at one to a few sequences): for each 32-value block
// of Q8_0, Q4_0 or Q4_1 (sub-block of Q4_K), y_i += d * (q . a_i), the int8 or nibble values
// widened to fp32 in registers and multiplied with the fp32 activations, never written out as fp32
// weights; Q6_K's 16-value groups are widened to their decoded values d sc (q - 32) in registers.
// The weight is ggml's value exactly; only the order of the fp32 roundings differs from decoding
// first (d applied to a block's sum rather than to each value; Q4_1's m and Q4_K's mins to the
// activations' block sums). Each accumulator is named at
// compile time (a register, not a stack slot indexed at run time) and summed as a tree. Built
// where the compiler targets AVX-512 or AVX2 with FMA and F16C; elsewhere rows are decoded,
// then dotted.
#if PREPACK_FUSED_DOT
inline float fp16_scale(const unsigned char* p) noexcept {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | (p[1] << 8)));
}

// The walk of the IQ4 kernels over a row at p of k values, 32 at a time (an IQ4_NL block, a
// sub-block of IQ4_XS): block(s, q, j, u) with s the 32 values' scale (IQ4_NL's d, IQ4_XS's
// d (ls - 32), one rounding), q their 16 bytes of indices, j the first value's index and u
// std::integral_constant<int, 0> for even ones and <int, 1> for odd ones (a kernel's two
// accumulators, named at compile time), then an odd last IQ4_NL block alone.
template <class Block>
inline void for_iq4_blocks(checkpoint::ggml_type type, const unsigned char* p, std::int64_t k,
                           Block&& block) {
  using even = std::integral_constant<int, 0>;
  using odd = std::integral_constant<int, 1>;
  if (type == checkpoint::ggml_type::iq4_nl) {
    for_block_pairs(
        p, k / 32, 18, 0,
        [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
          block(fp16_scale(q0), q0 + 2, b * 32, even{});
          if (!one) block(fp16_scale(q1), q1 + 2, (b + 1) * 32, odd{});
        });
    return;
  }
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 136) {
    const float d = fp16_scale(p);
    const unsigned scales_h = checkpoint::detail::le16(p + 2);
    const auto scale = [&](std::ptrdiff_t ib) {
      return d * static_cast<float>(checkpoint::detail::scale_iq4xs(ib, scales_h, p + 4));
    };
    for (std::ptrdiff_t ib = 0; ib < 8; ib += 2) {
      block(scale(ib), p + 8 + 16 * ib, sb * 256 + 32 * ib, even{});
      block(scale(ib + 1), p + 24 + 16 * ib, sb * 256 + 32 * ib + 32, odd{});
    }
  }
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
  for (std::ptrdiff_t u = 1; u < fused_per; ++u)
    t = fused_fma(q[u], fused_load(x + u * fused_lanes), t);
  return t;
}

// x's 32 values summed lane-wise.
inline fused_vec fused_sum32(const float* x) noexcept {
  fused_vec t = fused_load(x);
  for (std::ptrdiff_t u = 1; u < fused_per; ++u) t = fused_add(t, fused_load(x + u * fused_lanes));
  return t;
}

// A Q4_K block's 12 bytes of 6-bit scales and mins at q, all 8 of each at once (ggml's
// get_scale_min_k4): bytes 0-7 sc_0..7, bytes 8-15 m_0..7. For j < 4 sc_j = q[j] & 63 and m_j =
// q[j + 4] & 63; for j >= 4 sc_j = q[j + 4] & 15 | (q[j - 4] >> 6) << 4 and m_j = q[j + 4] >> 4
// | (q[j] >> 6) << 4. Reads 16 bytes at q (the block's nibbles follow its scales).
inline __m128i q4k_scale_bytes(const unsigned char* q) noexcept {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i low =
      _mm_shuffle_epi8(raw, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i high =
      _mm_shuffle_epi8(raw, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i m47 = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1);
  const __m128i shifted = _mm_blendv_epi8(low, _mm_srli_epi16(low, 4), m47);  // m_4..7's nibble
  const __m128i keep =
      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
  return _mm_or_si128(_mm_and_si128(shifted, keep),
                      _mm_and_si128(_mm_srli_epi16(high, 2), _mm_set1_epi8(0x30)));
}

// d sc_j (out[0..7]) and -dmin m_j (out[8..15]) of the Q4_K block at p, each product rounded
// once (as from the scalar values).
inline void q4k_block_scales(const unsigned char* p, float (&out)[16]) noexcept {
  const __m128i sm = q4k_scale_bytes(p + 4);
  const __m256 d = _mm256_set1_ps(fp16_scale(p)), dmin = _mm256_set1_ps(-fp16_scale(p + 2));
  _mm256_storeu_ps(out, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm))));
  _mm256_storeu_ps(
      out + 8,
      _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)))));
}

#if defined(__AVX512F__)
// fused_dot (below) of the 4-bit formats where a vector holds 16 floats: the 16 values a
// block's nibbles can stand for decoded once into a vector as ggml's dequantize_row_* defines
// them (Q4_0 d (q - 8); Q4_1 d q + m; Q4_K d sc q - dmin m of each 32-value sub-block, the
// product and the min fused into one rounding), then 16 nibbles at a time looked up in it
// (vpermps) and multiplied with each activation row: no widening to fp32 and no scale per value,
// and the mins are in the values rather than a separate sum of the activations. Q5_K's 32
// values a sub-block (the nibble and a fifth bit) are looked up in two vectors (vpermi2ps),
// Q3_K's 8 a 16-value group (two bits and a high bit) in one. Four accumulators a row (the
// 16-value quarters of 64 values), summed as a tree. O(M k).
template <int M>
__attribute__((flatten)) void fused_dot_lookup(checkpoint::ggml_type type, const unsigned char* p,
                                               std::int64_t k, const float* a, std::int64_t lda,
                                               float* y) noexcept {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[M][4];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm512_setzero_ps();
  // 16 indices (one a lane: permutexvar reads its low 4 bits) looked up in `values`, times
  // x[0..16) of each row, into acc u.
  const auto look = [&](__m512i index, __m512 values, const float* x, int u) {
    const __m512 w = _mm512_permutexvar_ps(index, values);
    for (int i = 0; i < M; ++i) {
      acc[i][u] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + i * lda), acc[i][u]);
    }
  };
  // 16 nibble bytes widened one a lane: the low nibbles index as they are, the high ones
  // shifted down (one widening for both, no masks).
  const auto bytes16 = [](const unsigned char* q) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  };
  const auto high = [](__m512i b) { return _mm512_srli_epi32(b, 4); };
  if (type == checkpoint::ggml_type::q4_k || type == checkpoint::ggml_type::q5_k) {
    // 256 values: d, dmin, 12 scale bytes, (Q5_K: 32 bytes of fifth bits,) 128 nibble bytes
    const bool q5 = type == checkpoint::ggml_type::q5_k;
    const std::int64_t bytes = q5 ? 176 : 144;
    const __m512 iota16 = _mm512_add_ps(iota, _mm512_set1_ps(16.0f));
    const __m512i bit4 = _mm512_set1_epi32(16);
    // Q5_K's 32 values a sub-block can stand for, looked up by 5-bit indices in two vectors
    const auto look32 = [&](__m512i index, __m512 lo, __m512 hi, const float* x, int u) {
      const __m512 w = _mm512_permutex2var_ps(lo, index, hi);
      for (int i = 0; i < M; ++i) {
        acc[i][u] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + i * lda), acc[i][u]);
      }
    };
    // index bits 0-3 from n, bit 4 from t (bits above 4 are not read)
    const auto fifth = [&](__m512i n, __m512i t) {
      return _mm512_ternarylogic_epi32(bit4, t, n, 0xCA);
    };
    for (std::int64_t b = 0; b < k / 256; ++b, p += bytes) {
      // d sc_j (lanes 0-7) and -dmin m_j (8-15), each product rounded once (q4k_block_scales)
      alignas(64) float ds[16];
      _mm512_store_ps(
          ds, _mm512_mul_ps(_mm512_insertf32x8(_mm512_set1_ps(fp16_scale(p)),
                                               _mm256_set1_ps(-fp16_scale(p + 2)), 1),
                            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scale_bytes(p + 4)))));
      const auto lane = [&](std::ptrdiff_t j) { return _mm512_set1_ps(ds[j]); };
      if (q5) {
        // dequantize_row_q5_K: value l of sub-block j is (its nibble | bit j of qh[l] << 4)
        // d sc_j - dmin m_j; t* hold qh[l] << 4 >> j, bit j at bit 4
        __m512i t0 = _mm512_slli_epi32(bytes16(p + 16), 4),
                t1 = _mm512_slli_epi32(bytes16(p + 32), 4);
        for (std::ptrdiff_t c = 0; c < 4; ++c) {
          const unsigned char* nib = p + 48 + 32 * c;
          const float* x = a + b * 256 + c * 64;
          const __m512 d0 = lane(2 * c), m0 = lane(8 + 2 * c);
          const __m512 d1 = lane(2 * c + 1), m1 = lane(9 + 2 * c);
          const __m512 v0 = _mm512_fmadd_ps(d0, iota, m0), w0 = _mm512_fmadd_ps(d0, iota16, m0);
          const __m512 v1 = _mm512_fmadd_ps(d1, iota, m1), w1 = _mm512_fmadd_ps(d1, iota16, m1);
          const __m512i n0 = bytes16(nib), n1 = bytes16(nib + 16);
          look32(fifth(n0, t0), v0, w0, x, 0);
          look32(fifth(n1, t1), v0, w0, x + 16, 1);
          look32(fifth(high(n0), _mm512_srli_epi32(t0, 1)), v1, w1, x + 32, 2);
          look32(fifth(high(n1), _mm512_srli_epi32(t1, 1)), v1, w1, x + 48, 3);
          t0 = _mm512_srli_epi32(t0, 2);
          t1 = _mm512_srli_epi32(t1, 2);
        }
        continue;
      }
      for (std::ptrdiff_t c = 0; c < 4;
           ++c) {  // 32 bytes: sub-block 2c's low nibbles, 2c + 1's high
        const unsigned char* nib = p + 16 + 32 * c;
        const float* x = a + b * 256 + c * 64;
        const __m512 v0 = _mm512_fmadd_ps(lane(2 * c), iota, lane(8 + 2 * c));
        const __m512 v1 = _mm512_fmadd_ps(lane(2 * c + 1), iota, lane(9 + 2 * c));
        const __m512i n0 = bytes16(nib), n1 = bytes16(nib + 16);
        look(n0, v0, x, 0);
        look(n1, v0, x + 16, 1);
        look(high(n0), v1, x + 32, 2);
        look(high(n1), v1, x + 48, 3);
      }
    }
  } else if (type == checkpoint::ggml_type::q3_k) {
    // 256 values: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, d.
    // dequantize_row_q3_K: value l of 16-value group g (128-value half n = g / 8, j = g / 2 % 4)
    // is d (s_g - 32) (((q[32 n + l] >> 2 j) & 3) - (bit 4 n + j of hm[l] ? 0 : 4)): the 3-bit
    // index (q bits, high bit) looked up in d (s_g - 32) (index - 4), an 8-value table twice
    const __m512 centred = _mm512_sub_ps(
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7), _mm512_set1_ps(4.0f));
    const __m512i low2 = _mm512_set1_epi32(3);
    for (std::int64_t b = 0; b < k / 256; ++b, p += 110) {
      alignas(64) float dl[16];  // d (s_g - 32)
      q3k_group_scales(p, dl);
      // hm[l] << 2, so that bit 4 n + j lands on bit 2 after a right shift by 4 n + j
      const __m512i h[2] = {_mm512_slli_epi32(bytes16(p), 2),
                            _mm512_slli_epi32(bytes16(p + 16), 2)};
      for (std::ptrdiff_t n = 0; n < 2; ++n) {
        const __m512i q[2] = {bytes16(p + 32 + 32 * n), bytes16(p + 48 + 32 * n)};
        // groups 8 n + 2 j + half, from bytes l (half 0) or l + 16 (half 1), into accumulator u
        const auto group = [&](int j, int half, int u) {
          const std::ptrdiff_t g = 8 * n + std::ptrdiff_t{2} * j + half;
          const __m512i index = _mm512_ternarylogic_epi32(
              low2, _mm512_srl_epi32(q[half], _mm_cvtsi32_si128(2 * j)),
              _mm512_srl_epi32(h[half], _mm_cvtsi32_si128(static_cast<int>(4 * n) + j)), 0xCA);
          look(index, _mm512_mul_ps(_mm512_set1_ps(dl[g]), centred), a + b * 256 + 16 * g, u);
        };
        for (int j = 0; j < 4; j += 2) {
          group(j, 0, 0);
          group(j, 1, 1);
          group(j + 1, 0, 2);
          group(j + 1, 1, 3);
        }
      }
    }
  } else if (type == checkpoint::ggml_type::iq4_nl || type == checkpoint::ggml_type::iq4_xs) {
    // IQ4_NL (18 bytes: d, 16 bytes of indices) and IQ4_XS's 32-value sub-blocks (scale d (ls
    // - 32)): the 16 values s kvalues_iq4nl[q], each product rounded once as decoding gives it;
    // even blocks (sub-blocks) into accumulators 0, 1, odd ones into 2, 3 (pairs a step: the
    // accumulators named at compile time)
    const __m512 kv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(checkpoint::detail::kvalues_iq4nl))));
    for_iq4_blocks(type, p, k, [&](float s, const unsigned char* q, std::int64_t j, auto u) {
      constexpr int U = 2 * decltype(u)::value;
      const __m512 v = _mm512_mul_ps(_mm512_set1_ps(s), kv);
      const __m512i n = bytes16(q);
      look(n, v, a + j, U);
      look(high(n), v, a + j + 16, U + 1);
    });
  } else {  // Q4_0 (18 bytes: d, 16 bytes) or Q4_1 (20: d, m, 16): value j < 16 byte j's low
    // nibble, j >= 16 byte j - 16's high one; even blocks into accumulators 0, 1, odd into 2, 3
    const bool q41 = type == checkpoint::ggml_type::q4_1;
    const std::int64_t bytes = q41 ? 20 : 18;
    const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
    for (std::int64_t b = 0; b < k / 32; ++b, p += bytes) {
      const __m512 d = _mm512_set1_ps(fp16_scale(p));
      const __m512 v = q41 ? _mm512_fmadd_ps(d, iota, _mm512_set1_ps(fp16_scale(p + 2)))
                           : _mm512_mul_ps(d, iota8);
      const unsigned char* q = p + (q41 ? 4 : 2);
      const __m512i n = bytes16(q);
      if (b % 2 == 0) {
        look(n, v, a + b * 32, 0);
        look(high(n), v, a + b * 32 + 16, 1);
      } else {
        look(n, v, a + b * 32, 2);
        look(high(n), v, a + b * 32 + 16, 3);
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    y[i] = fused_sum(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3]));
  }
}
#endif

// y[i] = a_i . row for M activation rows a[M][k] (lda) and one row of `type` (Q8_0, Q4_0: k a
// multiple of 32; Q4_K, Q6_K: of 256). Q4_K's values d sc q - dmin m of each 32-value sub-block
// enter as d sc (q . a) - dmin m (sum of a), where the 4-bit formats are not looked up
// (fused_dot_lookup, with 512-bit vectors). O(M k).
template <int M>
void fused_dot(checkpoint::ggml_type type, const unsigned char* p, std::int64_t k, const float* a,
               std::int64_t lda, float* y) noexcept {
#if defined(__AVX512F__)
  if (type == checkpoint::ggml_type::q4_0 || type == checkpoint::ggml_type::q4_1 ||
      type == checkpoint::ggml_type::q4_k || type == checkpoint::ggml_type::q5_k ||
      type == checkpoint::ggml_type::q3_k || type == checkpoint::ggml_type::iq4_nl ||
      type == checkpoint::ggml_type::iq4_xs) {
    fused_dot_lookup<M>(type, p, k, a, lda, y);
    return;
  }
#endif
  fused_vec acc[M][2];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = fused_zero();
  const __m128i mask = _mm_set1_epi8(0x0F);
  if (type == checkpoint::ggml_type::q6_k) {  // 256 values: 128 low nibbles, 64 2-bit highs,
    // 16 int8 scales, d; value d sc_g (q - 32) for 16-value groups g, each ds_g * (q - 32)
    // exactly as decoding gives it (ds_g = d sc_g rounded once), then dotted with each row.
    const __m128i three0 = _mm_set1_epi8(0x30), bias = _mm_set1_epi8(32);
    for (std::int64_t b = 0; b < k / 256; ++b, p += 210) {
      float ds16[16];  // ds_g of the 16 groups, converted and multiplied 8 at a time
      const __m256 d = _mm256_set1_ps(fp16_scale(p + 208));
      const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
      _mm256_storeu_ps(ds16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales))));
      _mm256_storeu_ps(
          ds16 + 8,
          _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scales, 8)))));
      for (std::ptrdiff_t half = 0; half < 2; ++half) {
        const unsigned char* ql = p + 64 * half;
        const unsigned char* qh = p + 128 + 32 * half;
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
  } else if (type == checkpoint::ggml_type::q4_k) {
    // 256 values: d, dmin, 12 scale bytes, 128 nibbles
    fused_vec mins[M][2];
    for (int i = 0; i < M; ++i) mins[i][0] = mins[i][1] = fused_zero();
    for (std::int64_t b = 0; b < k / 256; ++b, p += 144) {
      float ds[16];
      q4k_block_scales(p, ds);
      const unsigned char* nib = p + 16;
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
#if PREPACK_DEQUANTIZE_AVX2
  } else if (type == checkpoint::ggml_type::q5_0 || type == checkpoint::ggml_type::q5_1) {
    // 32 values: d, (Q5_1: m,) 32 high bits, 16 bytes of nibbles, as 32 bytes of 5-bit q
    // (q5_values32), widened: d (q - 16) . a (Q5_0), or d (q . a) + m (sum a) (Q5_1, the mins
    // into a chain of their own); even blocks into accumulator 0, odd ones into 1
    const bool q51 = type == checkpoint::ggml_type::q5_1;
    fused_vec mins[M];
    for (int i = 0; i < M; ++i) mins[i] = fused_zero();
    const auto block = [&](const unsigned char* blk, const float* x, auto u_acc) {
      constexpr int U = decltype(u_acc)::value;
      const __m256i v = checkpoint::detail::q5_values32(blk + (q51 ? 4 : 2), blk + (q51 ? 8 : 6));
      fused_vec q[fused_per];
      fused_widen32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1), q);
      if (!q51) {
        for (std::ptrdiff_t u = 0; u < fused_per; ++u) q[u] = fused_sub(q[u], fused_set1(16.0f));
      }
      const fused_vec d = fused_set1(fp16_scale(blk));
      for (int i = 0; i < M; ++i) acc[i][U] = fused_fma(fused_dot32(q, x + i * lda), d, acc[i][U]);
      if (q51) {
        const fused_vec m = fused_set1(fp16_scale(blk + 2));
        for (int i = 0; i < M; ++i) mins[i] = fused_fma(fused_sum32(x + i * lda), m, mins[i]);
      }
    };
    for_block_pairs(
        p, k / 32, q51 ? 24 : 22, 0,
        [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
          block(q0, a + b * 32, std::integral_constant<int, 0>{});
          if (!one) block(q1, a + (b + 1) * 32, std::integral_constant<int, 1>{});
        });
    for (int i = 0; i < M; ++i) acc[i][1] = fused_add(acc[i][1], mins[i]);
#endif
  } else if (type == checkpoint::ggml_type::iq4_nl || type == checkpoint::ggml_type::iq4_xs) {
    // 32 values (an IQ4_NL block, a sub-block of IQ4_XS): 16 bytes of indices looked up as
    // int8 kvalues_iq4nl by a byte shuffle, widened, then s (v . a); even blocks (sub-blocks)
    // into accumulator 0, odd ones into 1
    const __m128i table =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(checkpoint::detail::kvalues_iq4nl));
    for_iq4_blocks(type, p, k, [&](float s, const unsigned char* nib, std::int64_t j, auto acc_u) {
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
  } else if (type == checkpoint::ggml_type::q4_1) {
    // 32 values: d, m, 16 bytes (low nibbles j < 16, high ones j >= 16): d (q . a) + m (sum a),
    // into two accumulators each.
    fused_vec mins[M];
    for (int i = 0; i < M; ++i) mins[i] = fused_zero();
    for (std::int64_t b = 0; b < k / 32; ++b, p += 20) {
      const fused_vec d = fused_set1(fp16_scale(p)), m = fused_set1(fp16_scale(p + 2));
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
      fused_vec q[fused_per];
      fused_widen32(_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16(bytes, 4), mask), q);
      for (int i = 0; i < M; ++i) {
        const float* x = a + i * lda + b * 32;
        acc[i][0] = fused_fma(fused_dot32(q, x), d, acc[i][0]);
        mins[i] = fused_fma(fused_sum32(x), m, mins[i]);
      }
    }
    for (int i = 0; i < M; ++i) acc[i][1] = mins[i];
  } else {
    const bool q8 = type == checkpoint::ggml_type::q8_0;
    const std::int64_t block_bytes = q8 ? 34 : 18;
    // Two blocks a step into two accumulators each (indices known at compile time, so they
    // stay in registers), then an odd last block.
    const auto block = [&](const unsigned char* blk, const float* x0, fused_vec(&acc_i)[M]) {
      const fused_vec d = fused_set1(fp16_scale(blk));
      fused_vec q[fused_per];
      if (q8) {
        for (std::ptrdiff_t u = 0; u < fused_per; ++u) q[u] = fused_i8(blk + 2 + u * fused_lanes);
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
    for_block_pairs(
        p, k / 32, block_bytes, 0,
        [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
          block(q0, a + b * 32, even);
          if (!one) block(q1, a + (b + 1) * 32, odd);
        });
    for (int i = 0; i < M; ++i) {
      acc[i][0] = even[i];
      acc[i][1] = odd[i];
    }
  }
  for (int i = 0; i < M; ++i) y[i] = fused_sum(acc[i][0], acc[i][1]);
}
#endif

// ---- 8-bit activations (model_options::activations = activation_type::int8, opt-in) ----
//
// The activations of a row are quantized per 32-value block b as ggml's quantize_row_q8_0 does:
// d_b = max |x| / 127, q = x / d_b rounded to nearest (ties to even, as ggml's x86 kernels), so
// |x - d_b q| <= d_b / 2 for every value; prepack keeps d_b in fp32 (ggml rounds it to fp16) and
// also keeps each block's exact fp32 sum s_b. Weight blocks then dot in integers, exactly:
//   Q8_0, Q4_0, Q5_0   d_w d_b (w . q)
//   IQ4_NL, IQ4_XS     s d_b (v . q)        (v the int8 kvalues_iq4nl of the indices; s the
//                                            block's d, IQ4_XS's d (ls - 32) a sub-block)
//   Q4_1, Q5_1         d_w d_b (n . q) + m_w s_b
//   Q4_K, Q5_K         d sc_j d_b (n . q) - dmin m_j s_b  (32-value sub-block j; Q5_K's n
//                                                          with its fifth bit)
//   Q6_K, Q3_K         d_b (d sc_g (w . q) over its two 16-value groups g; Q3_K's d (s_g - 32))
// so a dot differs from the fp32 one by at most sum_b d_b / 2 sum_{i in b} |w_i - o_i| (o_i the
// value's offset, Q4_1's / Q5_1's m_w or Q4_K's -dmin m_j, which meets the exact sums; the bound
// the tests check), plus fp32 rounding. Each row's result depends on that row alone (not on how
// many rows multiply), so packing and batching keep every request equal to running it alone.

// A buffer's first 64-byte boundary (the buffers hold 64 bytes more than they use).
inline unsigned char* align64(unsigned char* p) noexcept {
  return p + ((64 - reinterpret_cast<std::uintptr_t>(p) % 64) % 64);
}

/// Rows of activations quantized to 8 bits per 32-value block (see above).
struct int8_rows {
  std::int64_t rows = 0, cols = 0;
  std::vector<std::int8_t> q;  // [rows][cols]
  std::vector<float> d, s;     // [rows][cols / 32]  each block's scale and exact sum
  // [rows][cols / 4]  minus the sum of each 4 consecutive values of q: where weights are dotted
  // as unsigned bytes u = w + o, o times these are what a lane's dot of u starts from so that
  // it sums w . q (int8_dot512 with VNNI, the only reader: empty on other builds)
  std::vector<std::int32_t> n4;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__) && defined(__AVX512F__) && \
    defined(__AVX512BW__) && defined(__AVX512VNNI__)  // as PREPACK_INT8_DOT512 with VNNI
  static constexpr bool lane_sums = true;
#else
  static constexpr bool lane_sums = false;
#endif

  // [rows / 4][pairs of blocks][4 rows][64 bytes of q | 16 int32 | 16 floats], 64-byte aligned:
  // each 4 rows' pairs of blocks laid out for int8_tile_dot (pack_tile), with each four-value
  // lane's -128 times its sum and its block's d; zeros past the rows and the blocks.
  std::vector<unsigned char> tiles;

  std::size_t bytes() const noexcept {
    return q.size() + (d.size() + s.size()) * sizeof(float) + n4.size() * sizeof(std::int32_t) +
           tiles.size();
  }
  /// Bytes of the tiles of m rows of k values (the memory estimate's count). O(1).
  static std::size_t tile_bytes(std::int64_t m, std::int64_t k) noexcept {
    return static_cast<std::size_t>((m + 3) / 4 * ((k / 32 + 1) / 2)) * 768 + 64;
  }
  /// Room for the tiles of the rows reset() sized. Cost: an allocation where they grow.
  void reset_tiles() {
    if (tiles.size() < tile_bytes(rows, cols)) tiles.resize(tile_bytes(rows, cols));
  }
  /// Tile t (rows 4 t .. 4 t + 3) at its first pair.
  const unsigned char* tile(std::int64_t t) const noexcept {
    return align64(const_cast<unsigned char*>(tiles.data())) + t * ((cols / 32 + 1) / 2) * 768;
  }
  /// Tile t laid out from the quantized rows and their lane sums n4 (lane_sums builds, the
  /// only callers; tiles on any threads, each once). O(4 cols).
  void pack_tile(std::int64_t t) noexcept {
    const std::int64_t nb = cols / 32, pairs = (nb + 1) / 2;
    unsigned char* base = const_cast<unsigned char*>(tile(t));
    for (std::int64_t i = 0; i < 4; ++i) {
      const std::int64_t r = 4 * t + i;
      for (std::int64_t p = 0; p < pairs; ++p) {
        unsigned char* dst = base + (p * 4 + i) * 192;
        std::memset(dst, 0, 192);
        if (r >= rows) continue;
        const std::int64_t blocks = std::min<std::int64_t>(2, nb - 2 * p);
        std::memcpy(dst, q.data() + r * cols + p * 64, static_cast<std::size_t>(blocks * 32));
        const std::int32_t* sums = n4.data() + r * (cols / 4) + p * 16;
        for (std::int64_t l = 0; l < blocks * 8; ++l) {
          const std::int32_t start = 128 * sums[l];
          std::memcpy(dst + 64 + 4 * l, &start, sizeof start);
          const float db = d[static_cast<std::size_t>(r * nb + 2 * p + l / 8)];
          std::memcpy(dst + 128 + 4 * l, &db, sizeof db);
        }
      }
    }
  }

  /// Sized for m rows of k values, k a multiple of 32 (the buffers only grow); quantize_row
  /// then fills each row. Cost: an allocation where the buffers grow.
  void reset(std::int64_t m, std::int64_t k) {
    rows = m;
    cols = k;
    const std::size_t n = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
    if (q.size() < n) {
      q.resize(n);
      if constexpr (lane_sums) n4.resize(n / 4);
    }
    if (d.size() < n / 32) {
      d.resize(n / 32);
      s.resize(n / 32);
    }
  }
  /// x[cols] quantized into row r (rows on any threads, each once). Non-finite values quantize
  /// to +-127 (NaN to -127) rather than to undefined bytes. Cost: O(cols).
  void quantize_row(std::int64_t r, const float* x) noexcept {
    std::int8_t* qr = q.data() + r * cols;
    float* dr = d.data() + r * (cols / 32);
    float* sr = s.data() + r * (cols / 32);
    for (std::int64_t b = 0; b < cols / 32; ++b) {
      const float* v = x + b * 32;
      float amax = 0.0f, sum = 0.0f;
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::abs(v[j]));
        sum += v[j];
      }
      const float db = amax / 127.0f;
      const float id = db > 0.0f ? 1.0f / db : 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float t = v[j] * id;
        qr[b * 32 + j] = static_cast<std::int8_t>(
            t >= -127.0f && t <= 127.0f ? std::nearbyint(t) : (t > 0.0f ? 127.0f : -127.0f));
      }
      dr[b] = db;
      sr[b] = sum;
    }
    if constexpr (!lane_sums) return;
    std::int32_t* nr = n4.data() + r * (cols / 4);
    for (std::int64_t l = 0; l < cols / 4; ++l) {
      const std::int8_t* v = qr + 4 * l;
      nr[l] = -(v[0] + v[1] + v[2] + v[3]);
    }
  }
};

/// Whether rows of `type` dot with 8-bit activations (int8_dot).
constexpr bool int8_dot_type(checkpoint::ggml_type type) noexcept {
  return type == checkpoint::ggml_type::q8_0 || type == checkpoint::ggml_type::q4_0 ||
         type == checkpoint::ggml_type::q4_1 || type == checkpoint::ggml_type::q4_k ||
         type == checkpoint::ggml_type::q5_k || type == checkpoint::ggml_type::q6_k ||
         type == checkpoint::ggml_type::q3_k || type == checkpoint::ggml_type::iq4_nl ||
         type == checkpoint::ggml_type::iq4_xs || type == checkpoint::ggml_type::q5_0 ||
         type == checkpoint::ggml_type::q5_1;
}

// The scalar terms of a row's dot (Q4_1's m_w s_b, Q4_K's -dmin m_j s_b) are summed in 8
// chains by block b mod 8, not one: a single chain of a dependent FMA a block bounded a row's
// dot by the FMA's latency. Then the 8 sums as a tree, the order int8_sum adds 8 lanes in.
inline float int8_tail(const float (&t)[8]) noexcept {
  return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define PREPACK_INT8_DOT 1
// 8 int32 lanes, each the sum of 4 products of u (unsigned) and s (signed) bytes; exact for
// |u| <= 128, |s| <= 127 (maddubs's int16 pairs stay within range).
inline __m256i int8_dot_us(__m256i u, __m256i s) noexcept {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
inline float int8_sum(__m256 v) noexcept {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}
inline float int8_fp16(const unsigned char* p) noexcept {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | (p[1] << 8)));
}
#else
#define PREPACK_INT8_DOT 0
#endif

#if PREPACK_INT8_DOT && defined(__AVX512F__) && defined(__AVX512BW__)
#define PREPACK_INT8_DOT512 1
// int8_dot_us over 64 bytes: 16 int32 lanes, each the sum of 4 products (the same bound).
inline __m512i int8_dot_us512(__m512i u, __m512i s) noexcept {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}
#else
#define PREPACK_INT8_DOT512 0
#endif

#if PREPACK_INT8_DOT512
// int8_dot (below) where vectors are 512 bits wide: two 32-value blocks a vector, lanes 0-7 the
// even block's and 8-15 the odd one's, so acc[i] holds the 8-lane path's two accumulators side
// by side and every lane sums the same products in the same order (results equal that path's to
// the bit) with about half the instructions. Where the CPU permutes bytes across two vectors
// (AVX512-VBMI) the 32-value formats take four blocks a step and gather their fp16 scales (and
// Q4_0's, Q4_1's nibbles) with one permute each instead of a scalar load and conversion a
// block. An odd last block takes the even lanes alone. O(M k).
template <int M>
__attribute__((flatten)) void int8_dot512(checkpoint::ggml_type type, const unsigned char* p,
                                          std::int64_t k, const int8_rows& a, std::int64_t i0,
                                          float* y) noexcept {
  using checkpoint::ggml_type;
  const std::int64_t nb = k / 32;
  const std::int8_t* aq[M];
  const float* ad[M];
  const float* as[M];
#if defined(__AVX512VNNI__)
  const std::int32_t* an[M];
  for (int i = 0; i < M; ++i) an[i] = a.n4.data() + (i0 + i) * (a.cols / 4);
#endif
  __m512 acc[M];
  float tails[M][8];  // Q4_1's and Q4_K's mins times the blocks' sums (int8_tail)
  for (int i = 0; i < M; ++i) {
    aq[i] = a.q.data() + (i0 + i) * a.cols;
    ad[i] = a.d.data() + (i0 + i) * (a.cols / 32);
    as[i] = a.s.data() + (i0 + i) * (a.cols / 32);
    acc[i] = _mm512_setzero_ps();
    for (float& t : tails[i]) t = 0.0f;
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const auto load32 = [](const unsigned char* q) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  };
  const auto halves = [](__m256i lo, __m256i hi) {  // [lo | hi]
    return _mm512_maskz_inserti64x4(0xFF, _mm512_zextsi256_si512(lo), hi, 1);
  };
  // Row i's activation blocks b and b + 1 (b's alone, the rest zero, where `one`).
  const auto act2 = [&](int i, std::int64_t b, bool one) {
    const std::int8_t* q = aq[i] + b * 32;
    return one ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)))
               : _mm512_loadu_si512(q);
  };
  const auto pair = [](float x0, float x1) {  // [x0 in lanes 0-7 | x1 in 8-15]
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(x0), 0xFF00, _mm_set_ss(x1));
  };
  // acc[i] += v * s lane-wise (the even lanes alone where `one`).
  const auto add = [&](int i, __m512i v, __m512 s, bool one) {
    acc[i] = _mm512_mask3_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, v), s, acc[i],
                                   one ? __mmask16{0x00FF} : __mmask16{0xFFFF});
  };
  // Signed weight bytes w against blocks b, b + 1: |w| . (a with w's sign), which is w . a in
  // every lane exactly as the 8-lane path's _mm256_sign_epi8 pair gives it (a is never -128;
  // where w is 0 both give a zero product). scale(i): the lanes' scales for activation row i.
  const auto signed_pair = [&](__m512i w, std::int64_t b, bool one, auto scale) {
    const __m512i aw = _mm512_abs_epi8(w);
    const __mmask64 neg = _mm512_movepi8_mask(w);
    for (int i = 0; i < M; ++i) {
      const __m512i x = act2(i, b, one);
      add(i, int8_dot_us512(aw, _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x)), scale(i),
          one);
    }
  };
  const auto unsigned_pair = [&](__m512i u, std::int64_t b, bool one, auto scale) {
    for (int i = 0; i < M; ++i) add(i, int8_dot_us512(u, act2(i, b, one)), scale(i), one);
  };
  // Q4_0's nibbles u = w + 8 (unsigned) against blocks b, b + 1. With VNNI each lane's dot
  // starts from 8 times minus the sum of its 4 activations (int8_rows::n4), so it ends at w . a,
  // the same integer signed_pair gives, in one instruction instead of five (Q4_0 decode 8%
  // faster; Q8_0's and Q6_K's bytes, loaded a pair at a time, measured slower or level so);
  // without, signed_pair on w.
  const auto offset8_pair = [&](__m512i u, std::int64_t b, bool one, auto scale) {
#if defined(__AVX512VNNI__)
    for (int i = 0; i < M; ++i) {
      const __m512i o = _mm512_slli_epi32(
          _mm512_maskz_loadu_epi32(one ? __mmask16{0x00FF} : __mmask16{0xFFFF}, an[i] + b * 8), 3);
      add(i, _mm512_dpbusd_epi32(o, u, act2(i, b, one)), scale(i), one);
    }
#else
    signed_pair(_mm512_sub_epi8(u, _mm512_set1_epi8(8)), b, one, scale);
#endif
  };
  // The 16 nibble bytes of blocks b and b + 1 at q0, q1: [q0's low | q0's high | q1's low |
  // q1's high] nibbles, the order of their 64 activations.
  const auto nibbles2 = [&](const unsigned char* q0, const unsigned char* q1) {
    const __m256i t = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q1)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0)));
    const __m512i u = halves(t, _mm256_srli_epi16(t, 4));  // q0, q1, q0 >> 4, q1 >> 4
    return _mm512_and_si512(_mm512_maskz_shuffle_i64x2(0xFF, u, u, 0xD8), low4);
  };
  // The lanes' scales d_w d_a of blocks b, b + 1 (fp16 d_w at q0, q1) for activation row i.
  const auto block_scales = [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b,
                                bool one) {
    const float d0 = int8_fp16(q0), d1 = int8_fp16(q1);
    return [&ad, &pair, d0, d1, b, one](int i) {
      return pair(d0 * ad[i][b], one ? 0.0f : d1 * ad[i][b + 1]);
    };
  };
#if defined(__AVX512VBMI__)
  // Four blocks a step (`bytes` each, 4 bytes <= 128): quad(w, b) with w the 128 bytes from
  // block b (two vectors); returns the first block the pairs above take on from.
  const auto block_quads = [&](std::int64_t bytes, auto quad) {
    std::int64_t b = 0;
    for (; b + 4 <= nb && (nb - b) * bytes >= 128; b += 4) {
      const unsigned char* q = p + b * bytes;
      const __m512i w[2] = {_mm512_loadu_si512(q), _mm512_loadu_si512(q + 64)};
      quad(w, b);
    }
    return b;
  };
  // Bytes [off, off + n) of each of 4 blocks of `bytes`, one after another, as a byte index.
  const auto gather_index = [](int bytes, int off, int n) {
    alignas(64) unsigned char idx[64] = {};
    for (int j = 0; j < 4; ++j) {
      for (int t = 0; t < n; ++t) idx[j * n + t] = static_cast<unsigned char>(j * bytes + off + t);
    }
    return _mm512_load_si512(idx);
  };
  // The four fp16 scales at byte `off` of 4 blocks of w as floats, times each activation row's
  // (lanes 0-3), then spread to two blocks a vector (blocks 0 and 1 of the four, or 2 and 3).
  const __m512i first2 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i last2 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  const auto quad_scales = [&](const __m512i(&w)[2], const __m512i& index, std::int64_t b,
                               __m128(&s)[M]) {
    const __m128 d =
        _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(w[0], index, w[1])));
    for (int i = 0; i < M; ++i) s[i] = _mm_mul_ps(d, _mm_loadu_ps(ad[i] + b));
  };
  const auto spread = [](__m128 s, const __m512i& which) {
    return _mm512_permutexvar_ps(which, _mm512_broadcast_f32x4(s));
  };
  // Q4_0 / Q4_1: [b's low | b's high | b+1's low | b+1's high] and the same for b + 2, b + 3
  // from 4 blocks' nibbles (16 bytes at `off` of each) in one vector n.
  const __m512i lanes01 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i lanes23 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  const auto split = [&](__m512i n, __m512i(&q)[2]) {
    const __m512i lo = _mm512_and_si512(n, low4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(n, 4), low4);
    q[0] = _mm512_permutex2var_epi64(lo, lanes01, hi);
    q[1] = _mm512_permutex2var_epi64(lo, lanes23, hi);
  };
#endif
  // The 16-value group formats (Q6_K, Q3_K): lane l of a pair of blocks' vector takes group
  // 4 q + l / 4 of the 16 (the pair q = 0 .. 3 of the 256 values); group g lies in activation
  // block g / 2.
  const __m512i groups[4] = {
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4),
      _mm512_set_epi32(11, 11, 11, 11, 10, 10, 10, 10, 9, 9, 9, 9, 8, 8, 8, 8),
      _mm512_set_epi32(15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12)};
  const __m512i block_of = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  switch (type) {
    case ggml_type::q8_0: {
      std::int64_t b0 = 0;
#if defined(__AVX512VBMI__)
      const __m512i scale_at = gather_index(34, 0, 2);
      b0 = block_quads(34, [&](const __m512i(&w)[2], std::int64_t b) {
        __m128 s[M];
        quad_scales(w, scale_at, b, s);
        const unsigned char* q = p + b * 34;
        signed_pair(halves(load32(q + 2), load32(q + 36)), b, false,
                    [&](int i) { return spread(s[i], first2); });
        signed_pair(halves(load32(q + 70), load32(q + 104)), b + 2, false,
                    [&](int i) { return spread(s[i], last2); });
      });
#endif
      for_block_pairs(
          p, nb, 34, b0,
          [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
            signed_pair(halves(load32(q0 + 2), load32(q1 + 2)), b, one,
                        block_scales(q0, q1, b, one));
          });
      break;
    }
    case ggml_type::q4_0: {
      std::int64_t b0 = 0;
#if defined(__AVX512VBMI__)
      const __m512i scale_at = gather_index(18, 0, 2), nibbles_at = gather_index(18, 2, 16);
      b0 = block_quads(18, [&](const __m512i(&w)[2], std::int64_t b) {
        __m128 s[M];
        quad_scales(w, scale_at, b, s);
        __m512i q[2];
        split(_mm512_permutex2var_epi8(w[0], nibbles_at, w[1]), q);
        offset8_pair(q[0], b, false, [&](int i) { return spread(s[i], first2); });
        offset8_pair(q[1], b + 2, false, [&](int i) { return spread(s[i], last2); });
      });
#endif
      for_block_pairs(
          p, nb, 18, b0,
          [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
            offset8_pair(nibbles2(q0 + 2, q1 + 2), b, one, block_scales(q0, q1, b, one));
          });
      break;
    }
    case ggml_type::q5_0:
    case ggml_type::q5_1: {  // 5-bit q (q5_values32): Q5_0's q - 16 as Q8_0, Q5_1's q as Q4_1's
      const bool q51 = type == ggml_type::q5_1;
      const auto values = [&](const unsigned char* q) {
        return checkpoint::detail::q5_values32(q + (q51 ? 4 : 2), q + (q51 ? 8 : 6));
      };
      for_block_pairs(
          p, nb, q51 ? 24 : 22, 0,
          [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
            const __m512i u = halves(values(q0), values(q1));
            if (!q51) {
              signed_pair(_mm512_sub_epi8(u, _mm512_set1_epi8(16)), b, one,
                          block_scales(q0, q1, b, one));
              return;
            }
            unsigned_pair(u, b, one, block_scales(q0, q1, b, one));
            for (std::int64_t e = b; e < b + (one ? 1 : 2); ++e) {
              const float m = int8_fp16(e == b ? q0 + 2 : q1 + 2);
              for (int i = 0; i < M; ++i) tails[i][e % 8] = std::fma(m, as[i][e], tails[i][e % 8]);
            }
          });
      break;
    }
    case ggml_type::iq4_nl: {  // the indices looked up as int8 kvalues_iq4nl, then as Q8_0
      const __m512i table = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(checkpoint::detail::kvalues_iq4nl)));
      for_block_pairs(
          p, nb, 18, 0,
          [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
            signed_pair(_mm512_shuffle_epi8(table, nibbles2(q0 + 2, q1 + 2)), b, one,
                        block_scales(q0, q1, b, one));
          });
      break;
    }
    case ggml_type::iq4_xs: {  // IQ4_NL's values, a scale d (ls - 32) each 32-value sub-block
      const __m512i table = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(checkpoint::detail::kvalues_iq4nl)));
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 136) {
        const float d = int8_fp16(p);
        const unsigned scales_h = checkpoint::detail::le16(p + 2);
        for (std::ptrdiff_t ib = 0; ib < 8; ib += 2) {
          const float d0 = d *
                           static_cast<float>(checkpoint::detail::scale_iq4xs(ib, scales_h, p + 4)),
                      d1 = d * static_cast<float>(
                                   checkpoint::detail::scale_iq4xs(ib + 1, scales_h, p + 4));
          const std::int64_t b = sb * 8 + ib;
          signed_pair(_mm512_shuffle_epi8(table, nibbles2(p + 8 + 16 * ib, p + 24 + 16 * ib)), b,
                      false, [&](int i) { return pair(d0 * ad[i][b], d1 * ad[i][b + 1]); });
        }
      }
      break;
    }
    case ggml_type::q4_1: {
      const auto mins = [&](const unsigned char* q, std::int64_t b) {
        const float m = int8_fp16(q + 2);
        for (int i = 0; i < M; ++i) tails[i][b % 8] = std::fma(m, as[i][b], tails[i][b % 8]);
      };
      std::int64_t b0 = 0;
#if defined(__AVX512VBMI__)
      const __m512i scale_at = gather_index(20, 0, 2), nibbles_at = gather_index(20, 4, 16);
      const __m512i min_at = gather_index(20, 2, 2);
      // the chains of blocks b mod 8 = 0 .. 3 and 4 .. 7 (the lanes of tails), in registers
      __m128 t[M][2];
      for (int i = 0; i < M; ++i) t[i][0] = t[i][1] = _mm_setzero_ps();
      b0 = block_quads(20, [&](const __m512i(&w)[2], std::int64_t b) {
        __m128 s[M];
        quad_scales(w, scale_at, b, s);
        __m512i q[2];
        split(_mm512_permutex2var_epi8(w[0], nibbles_at, w[1]), q);
        unsigned_pair(q[0], b, false, [&](int i) { return spread(s[i], first2); });
        unsigned_pair(q[1], b + 2, false, [&](int i) { return spread(s[i], last2); });
        const __m128 m =
            _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(w[0], min_at, w[1])));
        const int half = b % 8 == 0 ? 0 : 1;
        for (int i = 0; i < M; ++i) {
          t[i][half] = _mm_fmadd_ps(m, _mm_loadu_ps(as[i] + b), t[i][half]);
        }
      });
      for (int i = 0; i < M; ++i) {
        _mm_storeu_ps(tails[i], t[i][0]);
        _mm_storeu_ps(tails[i] + 4, t[i][1]);
      }
#endif
      for_block_pairs(
          p, nb, 20, b0,
          [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
            unsigned_pair(nibbles2(q0 + 4, q1 + 4), b, one, block_scales(q0, q1, b, one));
            mins(q0, b);
            if (!one) mins(q1, b + 1);
          });
      break;
    }
    case ggml_type::q4_k:
    case ggml_type::q5_k: {
      // Q5_K: Q4_K's scales and nibbles (after 32 bytes of fifth bits: bit j of byte l is value
      // l's of sub-block j), each value its nibble + 16 where that bit is set
      const bool q5 = type == ggml_type::q5_k;
      const std::int64_t bytes = q5 ? 176 : 144;
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      // lanes of sub-blocks 2c and 2c + 1 (c = 0 .. 3), from a vector of the 8 sub-blocks'
      const __m512i subs[4] = {_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                               _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
                               _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4),
                               _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 6, 6, 6)};
      const __m512i to_mins = _mm512_set_epi32(7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0);
      __m512 t[M];  // lanes 8-15: the chains of tails
      for (int i = 0; i < M; ++i) t[i] = _mm512_setzero_ps();
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += bytes) {
        const __m128i sm = q4k_scale_bytes(p + 4);
        // lanes 0-7: d sc_j, 8-15: dmin m_j (each product rounded once)
        const __m512 dm = _mm512_mul_ps(pair(int8_fp16(p), int8_fp16(p + 2)),
                                        _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_cvtepu8_epi32(sm)));
        __m512 s[M];  // lanes 0-7: d sc_j d_a of sub-block j, for each activation row
        for (int i = 0; i < M; ++i) {
          const __m512 a8 = _mm512_maskz_loadu_ps(0xFF, ad[i] + sb * 8);
          s[i] = _mm512_mul_ps(dm, a8);
          t[i] = _mm512_mask3_fnmadd_ps(
              dm, _mm512_permutexvar_ps(to_mins, _mm512_maskz_loadu_ps(0xFF, as[i] + sb * 8)), t[i],
              0xFF00);
        }
        // Q5_K: the fifth bits of sub-blocks 2c (low half) and 2c + 1 (high), at bit 0 of each
        // byte at step c (16-bit shifts: a byte's bit 0 is its own bit 2c or 2c + 1)
        const __m256i h = q5 ? load32(p + 16) : _mm256_setzero_si256();
        __m512i fifth = halves(h, _mm256_srli_epi16(h, 1));
        for (std::ptrdiff_t c = 0; c < 4;
             ++c) {  // 32 bytes: sub-block 2c's low nibbles, 2c + 1's high
          const __m256i v = load32(p + (q5 ? 48 : 16) + 32 * c);
          __m512i u = _mm512_and_si512(halves(v, _mm256_srli_epi16(v, 4)), low4);
          if (q5) {
            u = _mm512_or_si512(u, _mm512_and_si512(_mm512_slli_epi16(fifth, 4), bit4));
            fifth = _mm512_srli_epi16(fifth, 2);
          }
          unsigned_pair(u, sb * 8 + 2 * c, false,
                        [&](int i) { return _mm512_permutexvar_ps(subs[c], s[i]); });
        }
      }
      for (int i = 0; i < M; ++i) {
        _mm256_storeu_ps(tails[i], _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(
                                       0xF, _mm512_castps_pd(t[i]), 1)));
      }
      break;
    }
    case ggml_type::q3_k: {
      // 256 values as 16-value groups (q3k_group_scales): at 128-value half n and j = 0 .. 3,
      // 32 bytes of 3-bit values w + 4 (2 bits of q[32 n + l] at 2 j, bit 4 n + j of hm[l] above
      // them), two groups and one activation block; blocks 2 jj and 2 jj + 1 a pair
      const __m256i three = _mm256_set1_epi8(3), one_bit = _mm256_set1_epi8(1);
      const __m512i four = _mm512_set1_epi8(4);
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 110) {
        float dl[16];
        q3k_group_scales(p, dl);
        const __m512 g = _mm512_loadu_ps(dl);
        __m512 s[M];  // lane g: d (s_g - 32) d_a of group g's block, for each activation row
        for (int i = 0; i < M; ++i) {
          s[i] = _mm512_mul_ps(
              g, _mm512_permutexvar_ps(block_of, _mm512_maskz_loadu_ps(0xFF, ad[i] + sb * 8)));
        }
        const __m256i hm = load32(p);
        for (std::ptrdiff_t n = 0; n < 2; ++n) {
          const __m256i q = load32(p + 32 + 32 * n);
          const auto values = [&](std::ptrdiff_t j) {
            const __m256i low = _mm256_and_si256(
                _mm256_srl_epi16(q, _mm_cvtsi32_si128(static_cast<int>(2 * j))), three);
            const __m256i high = _mm256_and_si256(
                _mm256_srl_epi16(hm, _mm_cvtsi32_si128(static_cast<int>(4 * n + j))), one_bit);
            return _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
          };
          for (std::ptrdiff_t jj = 0; jj < 2; ++jj) {
            signed_pair(_mm512_sub_epi8(halves(values(2 * jj), values(2 * jj + 1)), four),
                        sb * 8 + 4 * n + 2 * jj, false,
                        [&](int i) { return _mm512_permutexvar_ps(groups[2 * n + jj], s[i]); });
          }
        }
      }
      break;
    }
    case ggml_type::q6_k: {
      const __m512i three0 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 210) {
        // d sc_g of the 16 groups (each product rounded once, as decoding gives it), times
        // each activation row's d_a of the group's block
        const __m512 g = _mm512_mul_ps(
            _mm512_set1_ps(int8_fp16(p + 208)),
            _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_cvtepi8_epi32(_mm_loadu_si128(
                                                 reinterpret_cast<const __m128i*>(p + 192)))));
        __m512 s[M];
        for (int i = 0; i < M; ++i) {
          s[i] = _mm512_mul_ps(
              g, _mm512_permutexvar_ps(block_of, _mm512_maskz_loadu_ps(0xFF, ad[i] + sb * 8)));
        }
        for (std::ptrdiff_t half = 0; half < 2; ++half) {
          const __m256i h = load32(p + 128 + 32 * half);
          const __m512i lh = _mm512_loadu_si512(p + 64 * half);  // [low bytes | high bytes]
          const __m512i ha = halves(_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2));
          const __m512i hb = halves(h, _mm256_srli_epi16(h, 2));
          const __m512i q01 =
              _mm512_or_si512(_mm512_and_si512(lh, low4), _mm512_and_si512(ha, three0));
          const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lh, 4), low4),
                                              _mm512_and_si512(hb, three0));
          const std::int64_t b = sb * 8 + half * 4;
          signed_pair(_mm512_sub_epi8(q01, bias), b, false,
                      [&](int i) { return _mm512_permutexvar_ps(groups[2 * half], s[i]); });
          signed_pair(_mm512_sub_epi8(q23, bias), b + 2, false,
                      [&](int i) { return _mm512_permutexvar_ps(groups[2 * half + 1], s[i]); });
        }
      }
      break;
    }
    default:
      break;
  }
  for (int i = 0; i < M; ++i) {
    const __m512d v = _mm512_castps_pd(acc[i]);
    const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, v, 0));
    const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, v, 1));
    y[i] = int8_sum(_mm256_add_ps(lo, hi)) + int8_tail(tails[i]);
  }
}
#endif

// y[i] = row . a_i for the M activation rows a.q + i0 (int8_rows) and one row of `type`
// (int8_dot_type; k a multiple of 32, of 256 for the K-quants). O(M k).
template <int M>
void int8_dot(checkpoint::ggml_type type, const unsigned char* p, std::int64_t k,
              const int8_rows& a, std::int64_t i0, float* y) noexcept {
#if PREPACK_INT8_DOT512
  int8_dot512<M>(type, p, k, a, i0, y);
#else
  using checkpoint::ggml_type;
  const std::int64_t nb = k / 32;
  const std::int8_t* aq[M];
  const float* ad[M];
  const float* as[M];
  for (int i = 0; i < M; ++i) {
    aq[i] = a.q.data() + (i0 + i) * a.cols;
    ad[i] = a.d.data() + (i0 + i) * (a.cols / 32);
    as[i] = a.s.data() + (i0 + i) * (a.cols / 32);
  }
  float tails[M][8];  // Q4_1's and Q4_K's mins times the blocks' sums (int8_tail)
  for (int i = 0; i < M; ++i) {
    for (float& t : tails[i]) t = 0.0f;
  }
  // Each sub-block's d sc_j and dmin m_j of a Q4_K block at q.
  const auto q4k_scales = [](const unsigned char* q, float d, float dmin, float(&dsc)[8],
                             float(&dmn)[8]) {
    for (int j = 0; j < 8; ++j) {
      unsigned sc, mn;
      checkpoint::detail::scale_min_k4(j, q + 4, sc, mn);
      dsc[j] = d * static_cast<float>(sc);
      dmn[j] = dmin * static_cast<float>(mn);
    }
  };
  // The mins against the blocks' exact sums (int8_tail), one rounding per term whatever M (a
  // contracted or split a * b + c would differ between instantiations).
  const auto q4k_mins = [&](std::int64_t sb, const float(&dmn)[8]) {
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < 8; ++j) tails[i][j] = std::fma(-dmn[j], as[i][sb * 8 + j], tails[i][j]);
    }
  };
#if PREPACK_INT8_DOT
  __m256 acc[M][2];
  for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const auto act = [&](int i, std::int64_t b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq[i] + b * 32));
  };
  // 32 signed weight bytes w against each row's block b: d_w d_b (w . q) into accumulator U.
  const auto signed_block = [&](__m256i w, std::int64_t b, float dw, auto u_acc) {
    constexpr int U = decltype(u_acc)::value;
    const __m256i aw = _mm256_sign_epi8(w, w);
    for (int i = 0; i < M; ++i) {
      const __m256i v = int8_dot_us(aw, _mm256_sign_epi8(act(i, b), w));
      acc[i][U] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(dw * ad[i][b]), acc[i][U]);
    }
  };
  // 32 signed weight bytes w of block b in two 16-value groups scaled g0 and g1 (Q6_K, Q3_K):
  // g d_b (w . q) over each group's lanes, into accumulator U.
  const auto grouped_block = [&](__m256i w, std::int64_t b, float g0, float g1, auto u_acc) {
    constexpr int U = decltype(u_acc)::value;
    const __m256i aw = _mm256_sign_epi8(w, w);
    const __m256 g = _mm256_set_m128(_mm_set1_ps(g1), _mm_set1_ps(g0));
    for (int i = 0; i < M; ++i) {
      const __m256i v = int8_dot_us(aw, _mm256_sign_epi8(act(i, b), w));
      acc[i][U] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(g, _mm256_set1_ps(ad[i][b])),
                                  acc[i][U]);
    }
  };
  // 32 unsigned weight bytes (nibbles) u: scale d_w d_b (u . q).
  const auto unsigned_block = [&](__m256i u, std::int64_t b, float dw, auto u_acc) {
    constexpr int U = decltype(u_acc)::value;
    for (int i = 0; i < M; ++i) {
      const __m256i v = int8_dot_us(u, act(i, b));
      acc[i][U] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(dw * ad[i][b]), acc[i][U]);
    }
  };
  using even = std::integral_constant<int, 0>;
  using odd = std::integral_constant<int, 1>;
  const auto nibbles = [&](const unsigned char* q16) {  // 16 bytes: low nibbles, then high
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q16));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(both, low4);
  };
  const __m256i eight = _mm256_set1_epi8(8);
  // The 32-value block formats (`bytes` a block): block(q, b, accumulator) for every block,
  // two a step, the even one into accumulator 0 and the odd one into 1, then an odd last one.
  const auto two_blocks_a_step = [&](std::int64_t bytes, auto block) {
    for_block_pairs(
        p, nb, bytes, 0,
        [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
          block(q0, b, even{});
          if (!one) block(q1, b + 1, odd{});
        });
  };
  switch (type) {
    case ggml_type::q8_0:
      two_blocks_a_step(34, [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 2));
        signed_block(w, b, int8_fp16(q), u_acc);
      });
      break;
    case ggml_type::q4_0:
      two_blocks_a_step(18, [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        signed_block(_mm256_sub_epi8(nibbles(q + 2), eight), b, int8_fp16(q), u_acc);
      });
      break;
    case ggml_type::q5_0:
      two_blocks_a_step(22, [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        signed_block(
            _mm256_sub_epi8(checkpoint::detail::q5_values32(q + 2, q + 6), _mm256_set1_epi8(16)), b,
            int8_fp16(q), u_acc);
      });
      break;
    case ggml_type::q5_1:
      two_blocks_a_step(24, [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        unsigned_block(checkpoint::detail::q5_values32(q + 4, q + 8), b, int8_fp16(q), u_acc);
        const float mw = int8_fp16(q + 2);
        for (int i = 0; i < M; ++i) tails[i][b % 8] = std::fma(mw, as[i][b], tails[i][b % 8]);
      });
      break;
    case ggml_type::iq4_nl:
    case ggml_type::iq4_xs: {  // the indices looked up as int8 kvalues_iq4nl, then as Q8_0
      const __m256i table = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(checkpoint::detail::kvalues_iq4nl)));
      const auto values = [&](const unsigned char* q16) {
        return _mm256_shuffle_epi8(table, nibbles(q16));
      };
      for_iq4_blocks(type, p, k, [&](float s, const unsigned char* q, std::int64_t j, auto u) {
        signed_block(values(q), j / 32, s, u);
      });
      break;
    }
    case ggml_type::q4_1:
      two_blocks_a_step(20, [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        unsigned_block(nibbles(q + 4), b, int8_fp16(q), u_acc);
        const float mw = int8_fp16(q + 2);
        for (int i = 0; i < M; ++i) tails[i][b % 8] = std::fma(mw, as[i][b], tails[i][b % 8]);
      });
      break;
    case ggml_type::q4_k:
    case ggml_type::q5_k: {
      // Q5_K: Q4_K's scales and nibbles after 32 bytes of fifth bits (bit j of byte l: value
      // l's of sub-block j), each value its nibble + 16 where that bit is set
      const bool q5 = type == ggml_type::q5_k;
      const __m256i bit4 = _mm256_set1_epi8(0x10);
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += q5 ? 176 : 144) {
        float dsc[8], dmn[8];
        q4k_scales(p, int8_fp16(p), int8_fp16(p + 2), dsc, dmn);
        // at step c, bit 0 of each byte its bit 2c (16-bit shifts keep a byte's own bits there)
        __m256i fifth = q5 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))
                           : _mm256_setzero_si256();
        for (std::ptrdiff_t c = 0; c < 4;
             ++c) {  // 32 bytes: sub-block 2c's low nibbles, 2c + 1's high
          const __m256i v =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + (q5 ? 48 : 16) + 32 * c));
          __m256i lo = _mm256_and_si256(v, low4),
                  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          if (q5) {
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(fifth, 4), bit4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(fifth, 3), bit4));
            fifth = _mm256_srli_epi16(fifth, 2);
          }
          const std::int64_t b = sb * 8 + 2 * c;
          unsigned_block(lo, b, dsc[2 * c], even{});
          unsigned_block(hi, b + 1, dsc[2 * c + 1], odd{});
        }
        q4k_mins(sb, dmn);
      }
      break;
    }
    case ggml_type::q3_k: {
      // 16-value groups (q3k_group_scales); at 128-value half n and j = 0 .. 3 the 32 values
      // w + 4 of activation block 4 n + j: 2 bits of q[32 n + l] at 2 j, bit 4 n + j of hm[l]
      const __m256i three = _mm256_set1_epi8(3), one_bit = _mm256_set1_epi8(1),
                    four = _mm256_set1_epi8(4);
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 110) {
        float dl[16];
        q3k_group_scales(p, dl);
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        for (std::ptrdiff_t n = 0; n < 2; ++n) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * n));
          const auto block = [&](std::ptrdiff_t j, auto u_acc) {
            const __m256i low = _mm256_and_si256(
                _mm256_srl_epi16(q, _mm_cvtsi32_si128(static_cast<int>(2 * j))), three);
            const __m256i high = _mm256_and_si256(
                _mm256_srl_epi16(hm, _mm_cvtsi32_si128(static_cast<int>(4 * n + j))), one_bit);
            grouped_block(_mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 2)), four),
                          sb * 8 + 4 * n + j, dl[8 * n + 2 * j], dl[8 * n + 2 * j + 1], u_acc);
          };
          block(0, even{});
          block(1, odd{});
          block(2, even{});
          block(3, odd{});
        }
      }
      break;
    }
    case ggml_type::q6_k: {
      const __m256i three0 = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 210) {
        const float d = int8_fp16(p + 208);
        const auto* scales = reinterpret_cast<const std::int8_t*>(p + 192);
        for (std::ptrdiff_t half = 0; half < 2; ++half) {
          const auto* ql = reinterpret_cast<const __m256i*>(p + 64 * half);
          const __m256i lo = _mm256_loadu_si256(ql), hi = _mm256_loadu_si256(ql + 1);
          const __m256i h =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * half));
          const __m256i q6[4] = {
              _mm256_or_si256(_mm256_and_si256(lo, low4),
                              _mm256_and_si256(_mm256_slli_epi16(h, 4), three0)),
              _mm256_or_si256(_mm256_and_si256(hi, low4),
                              _mm256_and_si256(_mm256_slli_epi16(h, 2), three0)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), low4),
                              _mm256_and_si256(h, three0)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(hi, 4), low4),
                              _mm256_and_si256(_mm256_srli_epi16(h, 2), three0))};
          const std::int8_t* sc = scales + 8 * half;
          const auto quarter = [&](std::ptrdiff_t qr, auto u_acc) {  // values [32 qr, 32 qr + 32)
            grouped_block(_mm256_sub_epi8(q6[qr], bias), sb * 8 + half * 4 + qr,
                          d * static_cast<float>(sc[2 * qr]),
                          d * static_cast<float>(sc[2 * qr + 1]), u_acc);
          };
          quarter(0, even{});
          quarter(1, odd{});
          quarter(2, even{});
          quarter(3, odd{});
        }
      }
      break;
    }
    default:
      break;
  }
  for (int i = 0; i < M; ++i) {
    y[i] = int8_sum(_mm256_add_ps(acc[i][0], acc[i][1])) + int8_tail(tails[i]);
  }
#else
  // The same sums without vectors: each 32-value block's (or 16-value group's) integer dot,
  // then its scale.
  for (int i = 0; i < M; ++i) y[i] = 0.0f;
  const auto dot = [&](int i, std::int64_t b, const int* w, int n, int from) {
    int sum = 0;
    for (int j = from; j < from + n; ++j) sum += w[j] * aq[i][b * 32 + j];
    return static_cast<float>(sum);
  };
  int w[32];
  const auto fp16 = checkpoint::detail::fp16;
  switch (type) {
    case ggml_type::q8_0:
    case ggml_type::q4_0:
    case ggml_type::q4_1:
    case ggml_type::q5_0:
    case ggml_type::q5_1: {
      const bool q5 = type == ggml_type::q5_0 || type == ggml_type::q5_1;
      const bool q51 = type == ggml_type::q5_1;
      const std::int64_t bytes = type == ggml_type::q8_0   ? 34
                                 : type == ggml_type::q4_0 ? 18
                                 : type == ggml_type::q4_1 ? 20
                                 : q51                     ? 24
                                                           : 22;
      for (std::int64_t b = 0; b < nb; ++b, p += bytes) {
        if (type == ggml_type::q8_0) {
          for (int j = 0; j < 32; ++j) w[j] = p[2 + j] < 128 ? p[2 + j] : p[2 + j] - 256;
        } else if (q5) {  // dequantize_row_q5_*: the nibble | bit j of qh at 16 (- 16 for Q5_0)
          std::uint32_t qh;
          std::memcpy(&qh, p + (q51 ? 4 : 2), 4);
          const unsigned char* qs = p + (q51 ? 8 : 6);
          const int off = q51 ? 0 : 16;
          for (int j = 0; j < 16; ++j) {
            w[j] = static_cast<int>((qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4)) - off;
            w[j + 16] = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - off;
          }
        } else {
          const unsigned char* qs = p + (type == ggml_type::q4_0 ? 2 : 4);
          const int off = type == ggml_type::q4_0 ? 8 : 0;
          for (int j = 0; j < 16; ++j) {
            w[j] = (qs[j] & 0x0F) - off;
            w[j + 16] = (qs[j] >> 4) - off;
          }
        }
        for (int i = 0; i < M; ++i) {
          y[i] += fp16(p) * ad[i][b] * dot(i, b, w, 32, 0);
          if (type == ggml_type::q4_1 || q51) {
            tails[i][b % 8] = std::fma(fp16(p + 2), as[i][b], tails[i][b % 8]);
          }
        }
      }
      break;
    }
    case ggml_type::iq4_nl:
    case ggml_type::iq4_xs: {
      const bool xs = type == ggml_type::iq4_xs;
      for (std::int64_t b = 0; b < nb; ++b) {  // a block of IQ4_NL, a sub-block of IQ4_XS
        const unsigned char* blk = xs ? p + b / 8 * 136 : p + b * 18;
        const std::ptrdiff_t ib = b % 8;
        const unsigned char* qs = xs ? blk + 8 + 16 * ib : blk + 2;
        const float s = xs ? fp16(blk) * static_cast<float>(checkpoint::detail::scale_iq4xs(
                                             ib, checkpoint::detail::le16(blk + 2), blk + 4))
                           : fp16(blk);
        for (int j = 0; j < 16; ++j) {
          w[j] = checkpoint::detail::kvalue_iq4nl(qs[j]);
          w[j + 16] = checkpoint::detail::kvalue_iq4nl(qs[j] >> 4u);
        }
        for (int i = 0; i < M; ++i) y[i] += s * ad[i][b] * dot(i, b, w, 32, 0);
      }
      break;
    }
    case ggml_type::q4_k:
    case ggml_type::q5_k: {
      const bool q5 = type == ggml_type::q5_k;
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += q5 ? 176 : 144) {
        float dsc[8], dmn[8];
        q4k_scales(p, fp16(p), fp16(p + 2), dsc, dmn);
        for (int c = 0; c < 4; ++c) {
          for (int hi = 0; hi < 2; ++hi) {
            for (int j = 0; j < 32; ++j) {
              w[j] = (p[(q5 ? 48 : 16) + 32 * c + j] >> (4 * hi)) & 0x0F;
              if (q5) w[j] |= ((p[16 + j] >> (2 * c + hi)) & 1) << 4;
            }
            const std::int64_t b = sb * 8 + std::int64_t{2} * c + hi;
            for (int i = 0; i < M; ++i) y[i] += dsc[2 * c + hi] * ad[i][b] * dot(i, b, w, 32, 0);
          }
        }
        q4k_mins(sb, dmn);
      }
      break;
    }
    case ggml_type::q3_k:
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 110) {
        float dl[16];
        q3k_group_scales(p, dl);
        for (int n = 0; n < 2; ++n) {
          for (int j = 0; j < 4; ++j) {
            for (int l = 0; l < 32; ++l) {  // dequantize_row_q3_K's value, + 4
              w[l] =
                  (((p[32 + 32 * n + l] >> (2 * j)) & 3) | (((p[l] >> (4 * n + j)) & 1) << 2)) - 4;
            }
            const std::int64_t b = sb * 8 + std::int64_t{4} * n + j;
            for (int i = 0; i < M; ++i) {
              y[i] += ad[i][b] * (dl[8 * n + 2 * j] * dot(i, b, w, 16, 0) +
                                  dl[8 * n + 2 * j + 1] * dot(i, b, w, 16, 16));
            }
          }
        }
      }
      break;
    case ggml_type::q6_k:
      for (std::int64_t sb = 0; sb < k / 256; ++sb, p += 210) {
        const float d = fp16(p + 208);
        for (std::ptrdiff_t half = 0; half < 2; ++half) {
          const unsigned char* ql = p + 64 * half;
          const unsigned char* qh = p + 128 + 32 * half;
          const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192 + 8 * half);
          for (std::ptrdiff_t qr = 0; qr < 4; ++qr) {
            for (int l = 0; l < 32; ++l) {  // dequantize_row_q6_K's q1..q4
              const int byte = qr % 2 == 0 ? ql[l] : ql[l + 32];
              const int nib = qr < 2 ? byte & 0x0F : byte >> 4;
              w[l] = (nib | (((qh[l] >> (2 * static_cast<int>(qr))) & 3) << 4)) - 32;
            }
            const std::int64_t b = sb * 8 + half * 4 + qr;
            for (int i = 0; i < M; ++i) {
              y[i] += ad[i][b] * (d * static_cast<float>(sc[2 * qr]) * dot(i, b, w, 16, 0) +
                                  d * static_cast<float>(sc[2 * qr + 1]) * dot(i, b, w, 16, 16));
            }
          }
        }
      }
      break;
    default:
      break;
  }
  for (int i = 0; i < M; ++i) y[i] += int8_tail(tails[i]);
#endif
#endif
}

// ---- 8-bit activations at many rows (AVX512-VNNI): weight rows converted once ----
//
// int8_dot decodes a weight row's blocks again for every few activation rows. From
// linear::int8_panel_rows activation rows on, a thread converts its 16 weight rows once into
// the form every dot above takes them in (int8_weight_rows), the activations are laid out 4 rows
// at a time (int8_rows::pack_tile), and int8_tile_dot multiplies 4 activation rows by 4 weight
// rows in registers. The integers are the same (exact), and so are each lane's scale, each
// lane's sequence of fused multiply-adds and the sums at the end (the min terms in int8_dot's 8
// chains): the result equals int8_dot's to the bit, whatever the number of rows.
#if PREPACK_INT8_DOT512 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PREPACK_INT8_PANEL 1
#else
#define PREPACK_INT8_PANEL 0
#endif

/// Weight rows as the integer dots take them, 4 rows interleaved a pair of 32-value blocks at a
/// time: for each row, 64 bytes of values v + 128 (unsigned bytes for vpdpbusd; v the value's
/// integer, Q4_1's / Q4_K's unsigned nibbles as they are) and the 16 lanes' scales (a four-value
/// lane's block scale, or for Q6_K and Q3_K its 16-value group's, each product of the format's
/// factors rounded once as int8_dot forms it); a single last block padded with v = 0, scale 0.
/// Besides, row-major, the weight of each block's min term where the format has one (Q4_1's /
/// Q5_1's m_w, Q4_K's / Q5_K's -dmin m_j).
struct int8_weight_rows {
  std::int64_t cols = 0, pairs = 0;
  std::vector<unsigned char> buffer;  // [rows / 4][pairs][4][64 bytes | 16 floats], aligned
  std::vector<float> min;             // [rows][cols / 32]
  std::vector<char> has_min;          // [rows]

  static std::size_t packed_bytes(std::int64_t n, std::int64_t k) noexcept {
    return static_cast<std::size_t>((n + 3) / 4 * ((k / 32 + 1) / 2)) * 512;
  }
  /// Bytes reset(n, k) holds (the memory estimate's count). O(1).
  static std::size_t bytes_for(std::int64_t n, std::int64_t k) noexcept {
    return packed_bytes(n, k) + 64 + static_cast<std::size_t>(n * (k / 32)) * sizeof(float) +
           static_cast<std::size_t>(n);
  }
  std::size_t bytes() const noexcept {
    return buffer.size() + min.size() * sizeof(float) + has_min.size();
  }
  /// Room for n rows of k values, k a multiple of 32 (the buffers only grow). Cost: an
  /// allocation where they grow.
  void reset(std::int64_t n, std::int64_t k) {
    cols = k;
    pairs = (k / 32 + 1) / 2;
    if (buffer.size() < packed_bytes(n, k) + 64) buffer.resize(packed_bytes(n, k) + 64);
    const auto mins = static_cast<std::size_t>(n * (k / 32));
    if (min.size() < mins) min.resize(mins);
    if (has_min.size() < static_cast<std::size_t>(n)) has_min.resize(static_cast<std::size_t>(n));
  }
  /// Row r's 4 interleaved groups start here; group g = r / 4 at pair 0.
  const unsigned char* group(std::int64_t g) const noexcept {
    return align64(const_cast<unsigned char*>(buffer.data())) + g * pairs * 512;
  }

  /// Row r as a row of zeros (a group's padding). O(cols).
  void clear_row(std::int64_t r) noexcept {
    unsigned char* base = const_cast<unsigned char*>(group(r / 4)) + (r % 4) * 128;
    for (std::int64_t q = 0; q < pairs; ++q) {
      std::memset(base + q * 512, 128, 64);
      std::memset(base + q * 512 + 64, 0, 64);
    }
    has_min[static_cast<std::size_t>(r)] = 0;
  }

#if PREPACK_INT8_PANEL
  /// Row r from one row of `type` at p (int8_dot_type; cols values): the vector decoder's walk
  /// (checkpoint::detail::for_int8_values), its values and scales stored instead of widened.
  /// O(cols).
  void convert_row(std::int64_t r, checkpoint::ggml_type type, const unsigned char* p) noexcept {
    unsigned char* base = const_cast<unsigned char*>(group(r / 4)) + (r % 4) * 128;
    float* mn = min.data() + r * (cols / 32);
    const std::int64_t nb = cols / 32;
    if (nb % 2 == 1) {  // the last pair's second block: zeros
      std::memset(base + (nb / 2) * 512 + 32, 128, 32);
      std::memset(base + (nb / 2) * 512 + 96, 0, 32);
    }
    bool mins = false;
    const auto block = checkpoint::dequantizable_block(type);
    std::int64_t b = 0;
    const auto elements = static_cast<std::int64_t>(block->elements);
    for (std::int64_t e = 0; e < cols; e += elements, p += block->bytes) {
      checkpoint::detail::for_int8_values(
          type, p, [&](auto with_min, __m256i v, float d0, float d1, float m) {
            unsigned char* at = base + (b / 2) * 512 + (b % 2) * 32;
            _mm256_store_si256(reinterpret_cast<__m256i*>(at),
                               _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))));
            _mm256_store_ps(reinterpret_cast<float*>(at + 64),
                            _mm256_setr_m128(_mm_set1_ps(d0), _mm_set1_ps(d1)));
            if constexpr (decltype(with_min)::value) {
              mn[b] = m;
              mins = true;
            }
            ++b;
          });
    }
    has_min[static_cast<std::size_t>(r)] = mins ? 1 : 0;
  }
#endif
};

#if PREPACK_INT8_PANEL
// y[i][r] = the lanes' sums of 4 activation rows (a tile at x, int8_rows::pack_tile) by 4
// weight rows (a group at w, int8_weight_rows), `pairs` pairs of blocks, the last a single
// block where `odd` (its lanes 8-15 untouched, as int8_dot leaves them). Each lane's dot starts
// from -128 times the sum of its 4 activations, so vpdpbusd of v + 128 ends at v . q. O(pairs).
inline void int8_tile_dot(const unsigned char* w, const unsigned char* x, std::int64_t pairs,
                          bool odd, const float* const (&wm)[4], const float* const (&as)[4],
                          float (&y)[4][4]) noexcept {
  __m512 acc[4][4];
  for (auto& row : acc) {
    for (__m512& v : row) v = _mm512_setzero_ps();
  }
  const auto step = [&](const unsigned char* wp, const unsigned char* xp, __mmask16 lm) {
    __m512i wv[4];
    __m512 sv[4];
    for (std::ptrdiff_t r = 0; r < 4; ++r) {
      wv[r] = _mm512_load_si512(wp + r * 128);
      sv[r] = _mm512_load_ps(wp + r * 128 + 64);
    }
    for (std::ptrdiff_t i = 0; i < 4; ++i) {
      const __m512i av = _mm512_load_si512(xp + i * 192);
      const __m512i start = _mm512_load_si512(xp + i * 192 + 64);
      const __m512 da = _mm512_load_ps(xp + i * 192 + 128);
      for (std::ptrdiff_t r = 0; r < 4; ++r) {
        const __m512 v = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, wv[r], av));
        acc[i][r] = _mm512_mask3_fmadd_ps(v, _mm512_mul_ps(sv[r], da), acc[i][r], lm);
      }
    }
  };
  const std::int64_t full = odd ? pairs - 1 : pairs;
  for (std::int64_t q = 0; q < full; ++q) step(w + q * 512, x + q * 768, 0xFFFF);
  if (odd) step(w + full * 512, x + full * 768, 0x00FF);
  for (int i = 0; i < 4; ++i) {
    for (int r = 0; r < 4; ++r) {
      const __m512d v = _mm512_castps_pd(acc[i][r]);
      const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, v, 0));
      const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, v, 1));
      y[i][r] = int8_sum(_mm256_add_ps(lo, hi));
    }
  }
  // The min terms (weight row r's wm[r], null where it has none; activation row i's block
  // sums as[i], null past the rows) in int8_dot's 8 chains by block b mod 8, each added by
  // int8_tail's tree (int8_sum's order); + 0 where there are none, as int8_dot's empty chains.
  __m256 t[4][4];
  for (auto& row : t) {
    for (__m256& v : row) v = _mm256_setzero_ps();
  }
  if (wm[0] != nullptr || wm[1] != nullptr || wm[2] != nullptr || wm[3] != nullptr) {
    const std::int64_t nb = 2 * pairs - (odd ? 1 : 0);
    for (std::int64_t b8 = 0; b8 < nb; b8 += 8) {
      const auto lm = static_cast<__mmask8>(nb - b8 >= 8 ? 0xFF : (1u << (nb - b8)) - 1u);
      __m256 sv[4];
      for (int i = 0; i < 4; ++i) {
        sv[i] = as[i] != nullptr ? _mm256_maskz_loadu_ps(lm, as[i] + b8) : _mm256_setzero_ps();
      }
      for (int r = 0; r < 4; ++r) {
        if (wm[r] == nullptr) continue;
        const __m256 m = _mm256_maskz_loadu_ps(lm, wm[r] + b8);
        for (int i = 0; i < 4; ++i) t[i][r] = _mm256_mask3_fmadd_ps(m, sv[i], t[i][r], lm);
      }
    }
  }
  for (int i = 0; i < 4; ++i) {
    for (int r = 0; r < 4; ++r) y[i][r] += int8_sum(t[i][r]);
  }
}
#endif

/// Whether rows of `type` dot straight from their blocks on this build (fused_dot; Q5_K and
/// Q3_K only where it looks values up).
constexpr bool fused_dot_type(checkpoint::ggml_type type) noexcept {
  return PREPACK_FUSED_DOT &&
         (type == checkpoint::ggml_type::q8_0 || type == checkpoint::ggml_type::q4_0 ||
          type == checkpoint::ggml_type::q4_1 || type == checkpoint::ggml_type::q4_k ||
          type == checkpoint::ggml_type::q6_k || type == checkpoint::ggml_type::iq4_nl ||
          type == checkpoint::ggml_type::iq4_xs ||
          (PREPACK_DEQUANTIZE_AVX2 &&
           (type == checkpoint::ggml_type::q5_0 || type == checkpoint::ggml_type::q5_1)) ||
          (PREPACK_FUSED_LOOKUP &&
           (type == checkpoint::ggml_type::q5_k || type == checkpoint::ggml_type::q3_k)));
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
