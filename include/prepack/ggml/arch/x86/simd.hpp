// prepack/ggml/arch/x86/simd.hpp - what prepack's x86 kernels share: which kernels this build
// has (the PREPACK_GGML_* macros, read off the compiler's target flags), the one fp16 load, the
// walk over a row's blocks in pairs, and the vector helpers of each kernel family (bytes to
// floats, nibbles, Q5's fifth bits, Q4_K's packed scales, the int8 dot products). Standard
// library and <immintrin.h> only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../quants.hpp"

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

// Blocks decoded in vectors (x86/decode.hpp).
#if defined(__AVX2__) && defined(__FMA__)
#define PREPACK_GGML_AVX2 1
#else
#define PREPACK_GGML_AVX2 0
#endif
// fp32 dots straight from the blocks (x86/dot_f32.hpp).
#if defined(__F16C__) && defined(__FMA__) && (defined(__AVX512F__) || defined(__AVX2__))
#define PREPACK_GGML_FUSED 1
#else
#define PREPACK_GGML_FUSED 0
#endif
// ... with the values looked up, where a vector holds 16 floats.
#if PREPACK_GGML_FUSED && defined(__AVX512F__)
#define PREPACK_GGML_LOOKUP 1
#else
#define PREPACK_GGML_LOOKUP 0
#endif
// int8 dots (x86/dot_q8.hpp), 256-bit and 512-bit.
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define PREPACK_GGML_INT8 1
#else
#define PREPACK_GGML_INT8 0
#endif
#if PREPACK_GGML_INT8 && defined(__AVX512F__) && defined(__AVX512BW__)
#define PREPACK_GGML_INT8_512 1
#else
#define PREPACK_GGML_INT8_512 0
#endif
// Weight rows converted once, 4 x 4 tiles in registers (x86/panel.hpp).
#if PREPACK_GGML_INT8_512 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PREPACK_GGML_INT8_PANEL 1
#else
#define PREPACK_GGML_INT8_PANEL 0
#endif

PREPACK_NAMESPACE_BEGIN
namespace ggml {
namespace x86 {

/// The types whose blocks the x86 kernels walk as 32 int8 values at a time with their scales
/// (decode.hpp's for_int8_values, dot_q8.hpp's cases, panel.hpp's weight rows): a type not
/// named here decodes and dots through the generic kernels.
template <ggml_type T>
inline constexpr bool has_int8_values =
    T == ggml_type::q4_0 || T == ggml_type::q4_1 || T == ggml_type::q5_0 || T == ggml_type::q5_1 ||
    T == ggml_type::q8_0 || T == ggml_type::q3_k || T == ggml_type::q4_k || T == ggml_type::q5_k ||
    T == ggml_type::q6_k || T == ggml_type::iq4_nl || T == ggml_type::iq4_xs;

// The fp16 value at p: the CPU's conversion where it has one (F16C: every AVX2 CPU prepack
// targets), else the library's (the same value: both are exact).
inline float fp16(const unsigned char* p) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(detail::le16(p));
#else
  return half::to_float(detail::le16(p));
#endif
}

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

#if PREPACK_GGML_AVX2 || PREPACK_GGML_FUSED || PREPACK_GGML_INT8
// The 16 int8 values IQ4's indices stand for (detail::kvalues_iq4nl), as a vector.
inline __m128i kvalues16() noexcept {
  return _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const void*>(detail::kvalues_iq4nl)));
}
#endif

#if PREPACK_GGML_AVX2
// y[0, 32) = s v + o for the 32 bytes v (signed), s = s_lo for the first 16 and s_hi for the
// last 16 (no offset unless `Offset`).
template <bool Offset = false>
inline void widen32(__m256i v, float s_lo, float s_hi, float* y, float o = 0.0f) noexcept {
#if defined(__AVX512F__)
  const __m128i half[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
  for (std::ptrdiff_t g = 0; g < 2; ++g) {
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(half[g]));
    const __m512 s = _mm512_set1_ps(g == 0 ? s_lo : s_hi);
    if constexpr (Offset) {
      _mm512_storeu_ps(y + 16 * g, _mm512_fmadd_ps(s, x, _mm512_set1_ps(o)));
    } else {
      _mm512_storeu_ps(y + 16 * g, _mm512_mul_ps(s, x));
    }
  }
#else
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  const __m128i eighths[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
  for (std::ptrdiff_t g = 0; g < 4; ++g) {
    const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eighths[g]));
    const __m256 s = _mm256_set1_ps(g < 2 ? s_lo : s_hi);
    if constexpr (Offset) {
      _mm256_storeu_ps(y + 8 * g, _mm256_fmadd_ps(s, x, _mm256_set1_ps(o)));
    } else {
      _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(s, x));
    }
  }
#endif
}
// A 16-byte vector's low nibbles (then the high ones) as 32 bytes.
inline __m256i nibbles32(const unsigned char* q) noexcept {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_setr_m128i(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}
inline __m256i load32(const unsigned char* q) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
}
// (v >> shift) & mask of each byte.
inline __m256i bits32(__m256i v, int shift, char mask) noexcept {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(mask));
}

// The 32 5-bit values of a Q5_0 / Q5_1 block as bytes: the nibbles at qs (low ones for values
// 0-15, high ones for 16-31), and 16 on value j where bit j of the 32-bit qh at `high` is set.
inline __m256i q5_values32(const unsigned char* high, const unsigned char* qs) noexcept {
  std::uint32_t qh;
  std::memcpy(&qh, high, 4);
  // byte j of the broadcast qh holds bit j in its place j mod 8: select byte j / 8
  const __m256i bytes = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i sixteen =
      _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
  return _mm256_or_si256(nibbles32(qs), sixteen);
}
#endif

#if PREPACK_GGML_FUSED
// The walk of the IQ4 kernels over a row at p of k values, 32 at a time (an IQ4_NL block, a
// sub-block of IQ4_XS): block(s, q, j, u) with s the 32 values' scale (IQ4_NL's d, IQ4_XS's
// d (ls - 32), one rounding), q their 16 bytes of indices, j the first value's index and u
// std::integral_constant<int, 0> for even ones and <int, 1> for odd ones (a kernel's two
// accumulators, named at compile time), then an odd last IQ4_NL block alone.
template <class Block>
inline void for_iq4_blocks(ggml_type type, const unsigned char* p, std::int64_t k, Block&& block) {
  using even = std::integral_constant<int, 0>;
  using odd = std::integral_constant<int, 1>;
  if (type == ggml_type::iq4_nl) {
    for_block_pairs(
        p, k / 32, sizeof(block_iq4_nl), 0,
        [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
          const auto &b0 = block_at<block_iq4_nl>(q0), &b1 = block_at<block_iq4_nl>(q1);
          block(fp16(b0.d.b), b0.qs, b * 32, even{});
          if (!one) block(fp16(b1.d.b), b1.qs, (b + 1) * 32, odd{});
        });
    return;
  }
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += sizeof(block_iq4_xs)) {
    const auto& blk = block_at<block_iq4_xs>(p);
    const float d = fp16(blk.d.b);
    const auto scale = [&](std::ptrdiff_t ib) {
      return d * static_cast<float>(detail::scale_iq4_xs(blk, ib));
    };
    for (std::ptrdiff_t ib = 0; ib < 8; ib += 2) {
      block(scale(ib), blk.qs + 16 * ib, sb * 256 + 32 * ib, even{});
      block(scale(ib + 1), blk.qs + 16 * ib + 16, sb * 256 + 32 * ib + 32, odd{});
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
  const auto& b = block_at<block_q4_k>(p);
  const __m128i sm = q4k_scale_bytes(b.scales);
  const __m256 d = _mm256_set1_ps(fp16(b.d.b)), dmin = _mm256_set1_ps(-fp16(b.dmin.b));
  _mm256_storeu_ps(out, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm))));
  _mm256_storeu_ps(
      out + 8,
      _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)))));
}

#endif

#if PREPACK_GGML_INT8
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
#endif

#if PREPACK_GGML_INT8_512
// int8_dot_us over 64 bytes: 16 int32 lanes, each the sum of 4 products (the same bound).
inline __m512i int8_dot_us512(__m512i u, __m512i s) noexcept {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}
#endif
}  // namespace x86
}  // namespace ggml
PREPACK_NAMESPACE_END
