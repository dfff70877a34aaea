// prepack/checkpoint/quant.hpp - ggml's tensor types (the numbers GGUF files store), the size of
// their blocks, and their dequantization to fp32 exactly as ggml defines each block
// (ggml-common.h, dequantize_row_* in ggml-quants.c): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS. Results equal gguf-py's
// gguf.quants.dequantize bit for bit: every product and sum is rounded to fp32 on its own, never
// fused into an FMA. Standard library only. Cost: O(elements) per row, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "../error.hpp"
#include "../numeric.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

PREPACK_NAMESPACE_BEGIN
namespace checkpoint {

/// ggml's tensor types, by the number a GGUF file stores (ggml.h, enum ggml_type).
enum class ggml_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

/// ggml's name of a type ("Q4_K"), or nullptr for a number ggml does not define here.
inline const char* ggml_type_name(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::f32:
      return "F32";
    case ggml_type::f16:
      return "F16";
    case ggml_type::q4_0:
      return "Q4_0";
    case ggml_type::q4_1:
      return "Q4_1";
    case ggml_type::q5_0:
      return "Q5_0";
    case ggml_type::q5_1:
      return "Q5_1";
    case ggml_type::q8_0:
      return "Q8_0";
    case ggml_type::q8_1:
      return "Q8_1";
    case ggml_type::q2_k:
      return "Q2_K";
    case ggml_type::q3_k:
      return "Q3_K";
    case ggml_type::q4_k:
      return "Q4_K";
    case ggml_type::q5_k:
      return "Q5_K";
    case ggml_type::q6_k:
      return "Q6_K";
    case ggml_type::q8_k:
      return "Q8_K";
    case ggml_type::iq2_xxs:
      return "IQ2_XXS";
    case ggml_type::iq2_xs:
      return "IQ2_XS";
    case ggml_type::iq3_xxs:
      return "IQ3_XXS";
    case ggml_type::iq1_s:
      return "IQ1_S";
    case ggml_type::iq4_nl:
      return "IQ4_NL";
    case ggml_type::iq3_s:
      return "IQ3_S";
    case ggml_type::iq2_s:
      return "IQ2_S";
    case ggml_type::iq4_xs:
      return "IQ4_XS";
    case ggml_type::i8:
      return "I8";
    case ggml_type::i16:
      return "I16";
    case ggml_type::i32:
      return "I32";
    case ggml_type::i64:
      return "I64";
    case ggml_type::f64:
      return "F64";
    case ggml_type::iq1_m:
      return "IQ1_M";
    case ggml_type::bf16:
      return "BF16";
    case ggml_type::tq1_0:
      return "TQ1_0";
    case ggml_type::tq2_0:
      return "TQ2_0";
    case ggml_type::mxfp4:
      return "MXFP4";
  }
  return nullptr;
}

/// A type's block: `elements` values stored in `bytes` bytes (1 and the element size for the
/// plain float types).
struct ggml_block {
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
};

/// The block of a type prepack dequantizes, or nothing for one it does not (its name, if ggml
/// has one, says what it is).
inline std::optional<ggml_block> dequantizable_block(ggml_type t) noexcept {
  constexpr std::uint64_t qk_k = 256;
  switch (t) {
    case ggml_type::f32:
      return ggml_block{1, 4};
    case ggml_type::f16:
    case ggml_type::bf16:
      return ggml_block{1, 2};
    case ggml_type::q4_0:
      return ggml_block{32, 2 + 16};
    case ggml_type::q4_1:
      return ggml_block{32, 2 + 2 + 16};
    case ggml_type::q5_0:
      return ggml_block{32, 2 + 4 + 16};
    case ggml_type::q5_1:
      return ggml_block{32, 2 + 2 + 4 + 16};
    case ggml_type::q8_0:
      return ggml_block{32, 2 + 32};
    case ggml_type::q2_k:
      return ggml_block{qk_k, qk_k / 16 + qk_k / 4 + 2 + 2};
    case ggml_type::q3_k:
      return ggml_block{qk_k, qk_k / 8 + qk_k / 4 + 12 + 2};
    case ggml_type::q4_k:
      return ggml_block{qk_k, 2 + 2 + 12 + qk_k / 2};
    case ggml_type::q5_k:
      return ggml_block{qk_k, 2 + 2 + 12 + qk_k / 8 + qk_k / 2};
    case ggml_type::q6_k:
      return ggml_block{qk_k, qk_k / 2 + qk_k / 4 + qk_k / 16 + 2};
    case ggml_type::iq4_nl:
      return ggml_block{32, 2 + 16};
    case ggml_type::iq4_xs:
      return ggml_block{qk_k, 2 + 2 + qk_k / 64 + qk_k / 2};
    case ggml_type::q8_1:
    case ggml_type::q8_k:
    case ggml_type::iq2_xxs:
    case ggml_type::iq2_xs:
    case ggml_type::iq3_xxs:
    case ggml_type::iq1_s:
    case ggml_type::iq3_s:
    case ggml_type::iq2_s:
    case ggml_type::i8:
    case ggml_type::i16:
    case ggml_type::i32:
    case ggml_type::i64:
    case ggml_type::f64:
    case ggml_type::iq1_m:
    case ggml_type::tq1_0:
    case ggml_type::tq2_0:
    case ggml_type::mxfp4:
      return std::nullopt;
  }
  return std::nullopt;
}

namespace detail {

inline std::uint16_t le16(const unsigned char* p) noexcept {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline float fp16(const unsigned char* p) noexcept { return half::to_float(le16(p)); }

// x, rounded to fp32 and kept apart from what follows: the compiler may not fuse a product with
// the next addition (an FMA rounds once, gguf's numpy and ggml's reference code twice).
inline float rounded(float x) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(x));
  return x;
#else
  volatile float v = x;
  return v;
#endif
}

// The 16 values IQ4_NL's and IQ4_XS's 4-bit indices stand for (ggml-common.h, kvalues_iq4nl).
inline constexpr std::int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};

// kvalues_iq4nl[q & 15] as an int (through its byte's bits, as a signed byte is read).
inline int kvalue_iq4nl(unsigned q) noexcept {
  const auto u = static_cast<unsigned char>(kvalues_iq4nl[q & 0x0Fu]);
  return u < 128 ? u : u - 256;
}

// The 6-bit scale ls of 32-value sub-block ib of an IQ4_XS block, minus 32 (its factor): low 4
// bits from the nibble ib % 2 of byte ib / 2 of scales_l, high 2 from bits 2 ib of scales_h.
inline int scale_iq4xs(std::ptrdiff_t ib, unsigned scales_h,
                       const unsigned char* scales_l) noexcept {
  return static_cast<int>(((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xFu) |
                          (((scales_h >> (2 * ib)) & 3u) << 4)) -
         32;
}

// 6-bit scale and min j of a Q4_K / Q5_K block's 12 packed bytes (get_scale_min_k4).
inline void scale_min_k4(int j, const unsigned char* q, unsigned& d, unsigned& m) noexcept {
  if (j < 4) {
    d = q[j] & 63u;
    m = q[j + 4] & 63u;
  } else {
    const unsigned hi = q[j + 4], lo_d = q[j - 4], lo_m = q[j];
    d = (hi & 0xFu) | ((lo_d >> 6) << 4);
    m = (hi >> 4) | ((lo_m >> 6) << 4);
  }
}

// The 16 signed 6-bit group scales (s - 32) of a Q3_K block's 12 packed bytes sp: low 4 bits
// from bytes 0-7 (low then high nibbles), high 2 bits from bytes 8-11.
inline void scales_k3(const unsigned char* sp, int (&out)[16]) noexcept {
  for (int j = 0; j < 16; ++j) {
    const unsigned lo = j < 8 ? (sp[j] & 0x0Fu) : (sp[j - 8] >> 4);
    const unsigned hi = (sp[8 + j % 4] >> (2 * (j / 4))) & 3u;
    out[j] = static_cast<int>(lo | (hi << 4)) - 32;
  }
}

// x as the block's arithmetic keeps it: rounded on its own (exact: ggml's reference results), or
// free to fuse with what follows (fast: the compiler vectorises the loops; within one fp32
// rounding of exact).
template <bool Exact>
inline float keep(float x) noexcept {
  if constexpr (Exact) {
    return rounded(x);
  } else {
    return x;
  }
}

// One block of `type` at p into y (its `elements` values).
// Inlined always: dequantize_fast calls it with the type a constant, so the switch folds away.
template <bool Exact = true>
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
inline void
dequantize_block(ggml_type type, const unsigned char* p, float* y) noexcept {
  switch (type) {
    case ggml_type::f32:
      std::memcpy(y, p, 4);
      return;
    case ggml_type::f16:
      y[0] = fp16(p);
      return;
    case ggml_type::bf16:
      y[0] = bfloat16::to_float(le16(p));
      return;
    case ggml_type::q4_0: {  // d, 16 bytes of two 4-bit values: (q - 8) d
      const float d = fp16(p);
      const unsigned char* qs = p + 2;
      for (int j = 0; j < 16; ++j) {
        y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
        y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
      }
      return;
    }
    case ggml_type::q4_1: {  // d, m, 16 bytes: q d + m
      const float d = fp16(p), m = fp16(p + 2);
      const unsigned char* qs = p + 4;
      for (int j = 0; j < 16; ++j) {
        y[j] = keep<Exact>(d * static_cast<float>(qs[j] & 0x0F)) + m;
        y[j + 16] = keep<Exact>(d * static_cast<float>(qs[j] >> 4)) + m;
      }
      return;
    }
    case ggml_type::q5_0: {  // d, 32 high bits, 16 bytes of low nibbles: (q - 16) d
      const float d = fp16(p);
      std::uint32_t qh;
      std::memcpy(&qh, p + 2, 4);
      const unsigned char* qs = p + 6;
      for (int j = 0; j < 16; ++j) {
        const int x0 = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16;
        const int x1 = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
        y[j] = d * static_cast<float>(x0);
        y[j + 16] = d * static_cast<float>(x1);
      }
      return;
    }
    case ggml_type::q5_1: {  // d, m, 32 high bits, 16 bytes: q d + m
      const float d = fp16(p), m = fp16(p + 2);
      std::uint32_t qh;
      std::memcpy(&qh, p + 4, 4);
      const unsigned char* qs = p + 8;
      for (int j = 0; j < 16; ++j) {
        const unsigned x0 = (qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4);
        const unsigned x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
        y[j] = keep<Exact>(d * static_cast<float>(x0)) + m;
        y[j + 16] = keep<Exact>(d * static_cast<float>(x1)) + m;
      }
      return;
    }
    case ggml_type::q8_0: {  // d, 32 int8: q d
      const float d = fp16(p);
      for (int j = 0; j < 32; ++j)
        y[j] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + j]));
      return;
    }
    case ggml_type::q2_k: {  // 16 scale bytes (4-bit scale | 4-bit min), 64 bytes of 2-bit q, d,
                             // dmin
      const unsigned char* scales = p;
      const unsigned char* q = p + 16;
      const float d = fp16(p + 80), dmin = fp16(p + 82);
      int is = 0;
      for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
          for (int half_ = 0; half_ < 2; ++half_) {
            const unsigned sc = scales[is++];
            const float dl = d * static_cast<float>(sc & 0xF);
            const float ml = dmin * static_cast<float>(sc >> 4);
            for (int l = 0; l < 16; ++l) {
              const unsigned v = (q[l + 16 * half_] >> shift) & 3u;
              *y++ = keep<Exact>(dl * static_cast<float>(v)) - ml;
            }
          }
        }
        q += 32;
      }
      return;
    }
    case ggml_type::q3_k: {  // 32 bytes high-bit mask, 64 bytes 2-bit q, 12 bytes 6-bit scales, d
      const unsigned char* hm = p;
      const unsigned char* q = p + 32;
      const unsigned char* sp = p + 96;
      const float d_all = fp16(p + 108);
      int scales[16];
      scales_k3(sp, scales);
      int is = 0;
      unsigned m = 1;
      for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
          for (int half_ = 0; half_ < 2; ++half_) {
            const float dl = d_all * static_cast<float>(scales[is++]);
            for (int l = 0; l < 16; ++l) {
              const int k = l + 16 * half_;
              const int v = static_cast<int>((q[k] >> shift) & 3u) - ((hm[k] & m) ? 0 : 4);
              *y++ = dl * static_cast<float>(v);
            }
          }
          m <<= 1;
        }
        q += 32;
      }
      return;
    }
    case ggml_type::q4_k: {  // d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
      const float d = fp16(p), dmin = fp16(p + 2);
      const unsigned char* sc = p + 4;
      const unsigned char* q = p + 16;
      for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        unsigned s, m;
        scale_min_k4(is, sc, s, m);
        const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(m);
        scale_min_k4(is + 1, sc, s, m);
        const float d2 = d * static_cast<float>(s), m2 = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) *y++ = keep<Exact>(d1 * static_cast<float>(q[l] & 0xF)) - m1;
        for (int l = 0; l < 32; ++l) *y++ = keep<Exact>(d2 * static_cast<float>(q[l] >> 4)) - m2;
      }
      return;
    }
    case ggml_type::q5_k: {  // d, dmin, 12 bytes scales, 32 bytes high bits, 128 bytes nibbles
      const float d = fp16(p), dmin = fp16(p + 2);
      const unsigned char* sc = p + 4;
      const unsigned char* qh = p + 16;
      const unsigned char* ql = p + 48;
      unsigned u1 = 1, u2 = 2;
      for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        unsigned s, m;
        scale_min_k4(is, sc, s, m);
        const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(m);
        scale_min_k4(is + 1, sc, s, m);
        const float d2 = d * static_cast<float>(s), m2 = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) {
          const unsigned v = (ql[l] & 0xFu) + ((qh[l] & u1) ? 16u : 0u);
          *y++ = keep<Exact>(d1 * static_cast<float>(v)) - m1;
        }
        for (int l = 0; l < 32; ++l) {
          const unsigned v = (ql[l] >> 4) + ((qh[l] & u2) ? 16u : 0u);
          *y++ = keep<Exact>(d2 * static_cast<float>(v)) - m2;
        }
      }
      return;
    }
    case ggml_type::q6_k: {  // 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales, d
      const unsigned char* ql = p;
      const unsigned char* qh = p + 128;
      const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
      const float d = fp16(p + 208);
      for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
        float ds[8];  // the 8 sub-block scales d * sc[k], each rounded once
        for (int k = 0; k < 8; ++k) ds[k] = keep<Exact>(d * static_cast<float>(sc[k]));
        for (int is = 0; is < 2; ++is) {  // values l of [16 is, 16 is + 16) share a scale
          for (int l = 16 * is; l < 16 * is + 16; ++l) {
            const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = ds[is] * static_cast<float>(q1);
            y[l + 32] = ds[is + 2] * static_cast<float>(q2);
            y[l + 64] = ds[is + 4] * static_cast<float>(q3);
            y[l + 96] = ds[is + 6] * static_cast<float>(q4);
          }
        }
      }
      return;
    }
    case ggml_type::iq4_nl: {  // d, 16 bytes of two 4-bit indices: d kvalues_iq4nl[q]
      const float d = fp16(p);
      const unsigned char* qs = p + 2;
      for (int j = 0; j < 16; ++j) {
        y[j] = d * static_cast<float>(kvalue_iq4nl(qs[j]));
        y[j + 16] = d * static_cast<float>(kvalue_iq4nl(qs[j] >> 4u));
      }
      return;
    }
    case ggml_type::iq4_xs: {  // d, 16 bits of high scale bits, 4 bytes of low ones, 128 bytes
                               // of indices: (d (ls - 32)) kvalues_iq4nl[q] per 32 values
      const float d = fp16(p);
      const unsigned scales_h = le16(p + 2);
      const unsigned char* qs = p + 8;
      for (std::ptrdiff_t ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
        const float dl = d * static_cast<float>(scale_iq4xs(ib, scales_h, p + 4));
        for (int j = 0; j < 16; ++j) {
          y[j] = dl * static_cast<float>(kvalue_iq4nl(qs[j]));
          y[j + 16] = dl * static_cast<float>(kvalue_iq4nl(qs[j] >> 4u));
        }
      }
      return;
    }
    default:
      PREPACK_ASSERT(false && "dequantize_block: a type without a block");
      return;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
#define PREPACK_DEQUANTIZE_AVX2 1
// dequantize_block<false> in vectors, for every block type but Q2_K (IQ4's indices looked up
// 32 at a time by a byte shuffle): the compiler vectorises
// the loops above poorly or not at all on some (a core, ns a value, AVX-512 / AVX2 builds: Q4_0
// 0.07 / 0.43 -> 0.04 / 0.06, Q4_1 0.09 / 0.51 -> 0.04 / 0.06, Q3_K 0.16 / 0.55 -> 0.05 /
// 0.08, Q6_K 0.20 / 0.18 -> 0.05 / 0.06). A block's values are made as 32 signed bytes at a
// time, then widened (16 at a time on AVX-512, 8 on AVX2), scaled and offset (one FMA where the
// loops' product and sum may fuse too: the same bound).

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
// fp16(p) by the CPU's conversion where it has one (F16C: every AVX2 CPU prepack targets).
inline float fp16_fast(const unsigned char* p) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(le16(p));
#else
  return fp16(p);
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

// The 32-value blocks of one ggml block of `type` at p (32 or 256 values), in order, as
// block(has_min, v, d0, d1, m): 32 bytes of integers v (signed; Q4_1's, Q5_1's, Q4_K's and
// Q5_K's unsigned) whose values are d0 v (the first 16; d1 v the rest) and, where has_min (a
// std::bool_constant), d0 v + m; each scale the product ggml's definition rounds once. The
// vector decoder's walk and the int8 weight rows' (reference::detail::int8_weight_rows).
// Returns false, calling nothing, for a type it does not walk (Q2_K and the unquantized ones).
template <class Block>
inline bool for_int8_values(ggml_type type, const unsigned char* p, Block&& block) noexcept {
  const std::false_type no;
  const std::true_type yes;
  switch (type) {
    case ggml_type::q4_0: {
      const float d = fp16_fast(p);
      block(no, _mm256_sub_epi8(nibbles32(p + 2), _mm256_set1_epi8(8)), d, d, 0.0f);
      return true;
    }
    case ggml_type::q4_1: {
      const float d = fp16_fast(p), m = fp16_fast(p + 2);
      block(yes, nibbles32(p + 4), d, d, m);
      return true;
    }
    case ggml_type::q5_0:
    case ggml_type::q5_1: {  // the nibbles with bit j of the 32-bit qh as 16 on value j
      const bool q51 = type == ggml_type::q5_1;
      const float d = fp16_fast(p), m = q51 ? fp16_fast(p + 2) : 0.0f;
      const __m256i v = q5_values32(p + (q51 ? 4 : 2), p + (q51 ? 8 : 6));
      if (q51) {
        block(yes, v, d, d, m);
      } else {
        block(no, _mm256_sub_epi8(v, _mm256_set1_epi8(16)), d, d, 0.0f);
      }
      return true;
    }
    case ggml_type::q8_0: {
      const float d = fp16_fast(p);
      block(no, load32(p + 2), d, d, 0.0f);
      return true;
    }
    case ggml_type::q3_k: {
      const unsigned char* sp = p + 96;
      const float d_all = fp16_fast(p + 108);
      int scales[16];
      scales_k3(sp, scales);
      float ds[16];
      for (int j = 0; j < 16; ++j) ds[j] = d_all * static_cast<float>(scales[j]);
      const __m256i hm = load32(p), four = _mm256_set1_epi8(4);
      const unsigned char* qs = p + 32;
      for (int n = 0, is = 0; n < 2; ++n, qs += 32) {
        const __m256i q = load32(qs);
        for (int shift = 0; shift < 8; shift += 2, is += 2) {
          // minus 4 where the value's high bit (bit 4 n + shift / 2 of hm) is clear
          const __m256i h = bits32(hm, 4 * n + shift / 2, 1);
          const __m256i v =
              _mm256_sub_epi8(bits32(q, shift, 3),
                              _mm256_and_si256(_mm256_cmpeq_epi8(h, _mm256_setzero_si256()), four));
          block(no, v, ds[is], ds[is + 1], 0.0f);
        }
      }
      return true;
    }
    case ggml_type::q4_k:
    case ggml_type::q5_k: {  // Q5_K: Q4_K's nibbles plus 16 where bit 2 j + h of qh[l] is set
      const bool q5 = type == ggml_type::q5_k;
      const float d = fp16_fast(p), dmin = fp16_fast(p + 2);
      const unsigned char* sc = p + 4;
      const __m256i qh = q5 ? load32(p + 16) : _mm256_setzero_si256();
      const __m256i sixteen = _mm256_set1_epi8(16);
      const unsigned char* qs = p + (q5 ? 48 : 16);
      for (int j = 0; j < 4; ++j, qs += 32) {
        const __m256i ql = load32(qs);
        for (int h = 0; h < 2; ++h) {
          unsigned s, m;
          scale_min_k4(2 * j + h, sc, s, m);
          const float ds = d * static_cast<float>(s), ms = -(dmin * static_cast<float>(m));
          __m256i v = bits32(ql, 4 * h, 0x0F);
          if (q5) {
            v = _mm256_or_si256(
                v, _mm256_and_si256(_mm256_slli_epi16(bits32(qh, 2 * j + h, 1), 4), sixteen));
          }
          block(yes, v, ds, ds, ms);
        }
      }
      return true;
    }
    case ggml_type::q6_k: {
      const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
      const float d = fp16_fast(p + 208);
      const __m256i c32 = _mm256_set1_epi8(32);
      const unsigned char* ql = p;
      const unsigned char* qh = p + 128;
      for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8) {
        const __m256i ql0 = load32(ql), ql1 = load32(ql + 32), h = load32(qh);
        const __m256i v[4] = {
            _mm256_or_si256(bits32(ql0, 0, 0x0F), _mm256_slli_epi16(bits32(h, 0, 3), 4)),
            _mm256_or_si256(bits32(ql1, 0, 0x0F), _mm256_slli_epi16(bits32(h, 2, 3), 4)),
            _mm256_or_si256(bits32(ql0, 4, 0x0F), _mm256_slli_epi16(bits32(h, 4, 3), 4)),
            _mm256_or_si256(bits32(ql1, 4, 0x0F), _mm256_slli_epi16(bits32(h, 6, 3), 4))};
        for (std::ptrdiff_t g = 0; g < 4; ++g) {
          block(no, _mm256_sub_epi8(v[g], c32), d * static_cast<float>(sc[2 * g]),
                d * static_cast<float>(sc[2 * g + 1]), 0.0f);
        }
      }
      return true;
    }
    case ggml_type::iq4_nl:
    case ggml_type::iq4_xs: {  // each 16-byte group of indices looked up as 32 values
      const __m128i table = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const void*>(kvalues_iq4nl)));
      const __m256i values = _mm256_setr_m128i(table, table);
      const auto lookup = [&](const unsigned char* q) {
        return _mm256_shuffle_epi8(values, nibbles32(q));
      };
      const float d = fp16_fast(p);
      if (type == ggml_type::iq4_nl) {
        block(no, lookup(p + 2), d, d, 0.0f);
        return true;
      }
      const unsigned scales_h = le16(p + 2);
      for (std::ptrdiff_t ib = 0; ib < 8; ++ib) {
        const float dl = d * static_cast<float>(scale_iq4xs(ib, scales_h, p + 4));
        block(no, lookup(p + 8 + 16 * ib), dl, dl, 0.0f);
      }
      return true;
    }
    default:
      return false;
  }
}

inline void dequantize_block_avx2(ggml_type type, const unsigned char* p, float* y) noexcept {
  const bool walked =
      for_int8_values(type, p, [&y](auto has_min, __m256i v, float d0, float d1, float m) {
        if constexpr (decltype(has_min)::value) {
          widen32<true>(v, d0, d1, y, m);
        } else {
          widen32(v, d0, d1, y);
        }
        y += 32;
      });
  if (!walked) dequantize_block<false>(type, p, y);
}
#else
#define PREPACK_DEQUANTIZE_AVX2 0
#endif

}  // namespace detail

/// Dequantizes n values of `type` stored at `src` (n / block elements whole blocks, `src`
/// holding n / elements * bytes bytes) into out[0, n). Throws prepack::error, writing nothing,
/// for a type prepack does not dequantize or an n that is not a whole number of blocks.
inline void dequantize(ggml_type type, const unsigned char* src, std::size_t n, float* out) {
  const std::optional<ggml_block> b = dequantizable_block(type);
  if (!b) {
    const char* name = ggml_type_name(type);
    prepack::detail::fail("ggml type ", name != nullptr ? name : "", name != nullptr ? " (" : "",
                          static_cast<std::uint32_t>(type), name != nullptr ? ")" : "",
                          " cannot be dequantized");
  }
  prepack::detail::require(n % b->elements == 0, "ggml type ", ggml_type_name(type), ": ", n,
                           " values are not a whole number of ", b->elements, "-value blocks");
  const std::size_t blocks = n / b->elements;
  for (std::size_t k = 0; k < blocks; ++k) {
    detail::dequantize_block(type, src + k * b->bytes, out + k * b->elements);
  }
}

/// dequantize's values with the products free to fuse with the additions that follow (one
/// rounding where dequantize rounds twice: within one fp32 rounding of it, and vectorised), for
/// weights decoded inside a GEMM. n a whole number of blocks of a type dequantizable_block
/// knows: checked by the caller (reference::quantized_matrix checks both when it is made).
/// Cost: n values, no allocation, no throw.
inline void dequantize_fast(ggml_type type, const unsigned char* src, std::size_t n,
                            float* out) noexcept {
  const std::optional<ggml_block> b = dequantizable_block(type);
  if (!b) return;
  if (type == ggml_type::f32) {
    std::memcpy(out, src, n * sizeof(float));
    return;
  }
  const std::size_t blocks = n / b->elements;
  // One loop per type, the type a constant in it: the block's switch folds away and the
  // compiler vectorises across the block's values (5 -> 3x faster for Q8_0 than switching per
  // block).
  const auto run = [&](auto constant) {
    constexpr ggml_type t = decltype(constant)::value;
    for (std::size_t k = 0; k < blocks; ++k) {
#if PREPACK_DEQUANTIZE_AVX2
      if constexpr (t != ggml_type::q2_k) {
        detail::dequantize_block_avx2(t, src + k * b->bytes, out + k * b->elements);
        continue;
      }
#endif
      detail::dequantize_block<false>(t, src + k * b->bytes, out + k * b->elements);
    }
  };
  switch (type) {
#define PREPACK_DEQUANTIZE_CASE(t)                          \
  case ggml_type::t:                                        \
    run(std::integral_constant<ggml_type, ggml_type::t>{}); \
    return;
    PREPACK_DEQUANTIZE_CASE(q4_0)
    PREPACK_DEQUANTIZE_CASE(q4_1)
    PREPACK_DEQUANTIZE_CASE(q5_0)
    PREPACK_DEQUANTIZE_CASE(q5_1)
    PREPACK_DEQUANTIZE_CASE(q8_0)
    PREPACK_DEQUANTIZE_CASE(q2_k)
    PREPACK_DEQUANTIZE_CASE(q3_k)
    PREPACK_DEQUANTIZE_CASE(q4_k)
    PREPACK_DEQUANTIZE_CASE(q5_k)
    PREPACK_DEQUANTIZE_CASE(q6_k)
    PREPACK_DEQUANTIZE_CASE(iq4_nl)
    PREPACK_DEQUANTIZE_CASE(iq4_xs)
#undef PREPACK_DEQUANTIZE_CASE
    default:  // F16, BF16: one value a block
      for (std::size_t k = 0; k < blocks; ++k) {
        detail::dequantize_block<false>(type, src + k * b->bytes, out + k * b->elements);
      }
  }
}

}  // namespace checkpoint
PREPACK_NAMESPACE_END
