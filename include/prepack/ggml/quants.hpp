// prepack/ggml/quants.hpp - the generic (scalar) kernels of every type ggml/types.hpp decodes,
// organised as ggml's quants.c: for each type, its block decoded exactly as ggml defines it
// (dequantize_row_* in ggml-quants.c; equal to gguf-py's gguf.quants.dequantize bit for bit:
// every product and sum rounded to fp32 on its own, never fused into an FMA) and its int8 form
// (the integers and scales the 8-bit-activation dots take); then one fp32 dot and one int8 dot
// over those for any type. These run on any CPU, are the fallback where ggml/arch/ has no
// vector kernel, and are the tests' oracle for the vector ones. Also the 8-bit activations
// (int8_rows, quantized as ggml's quantize_row_q8_0). Standard library only. Cost: O(values).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "types.hpp"

PREPACK_NAMESPACE_BEGIN
namespace ggml {
namespace detail {

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

inline std::uint16_t le16(const unsigned char* p) noexcept {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline std::uint32_t le32(const unsigned char* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
inline int as_int8(unsigned char c) noexcept { return c < 128 ? c : c - 256; }

// The 16 values IQ4_NL's and IQ4_XS's 4-bit indices stand for (ggml-common.h, kvalues_iq4nl).
inline constexpr std::int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};
inline int kvalue_iq4nl(unsigned q) noexcept { return kvalues_iq4nl[q & 0x0Fu]; }

// ---- The scale unpackers, once each ----

// 6-bit scale d and min m of sub-block j of a Q4_K / Q5_K block's 12 packed bytes
// (get_scale_min_k4).
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
// from bytes 0-7 (low then high nibbles), high 2 bits from bytes 8-11 (ggml's kmask1 / kmask2).
inline void scales_q3_k(const unsigned char* sp, int (&out)[16]) noexcept {
  for (int j = 0; j < 16; ++j) {
    const unsigned lo = j < 8 ? (sp[j] & 0x0Fu) : (sp[j - 8] >> 4);
    const unsigned hi = (sp[8 + j % 4] >> (2 * (j / 4))) & 3u;
    out[j] = static_cast<int>(lo | (hi << 4)) - 32;
  }
}

// d (s_g - 32) of a Q3_K block's 16 value groups g (dequantize_row_q3_K's dl, one rounding).
inline void group_scales_q3_k(const block_q3_k& b, float (&dl)[16]) noexcept {
  int s[16];
  scales_q3_k(b.scales, s);
  const float d = b.d.value();
  for (int g = 0; g < 16; ++g) dl[g] = d * static_cast<float>(s[g]);
}

// The 6-bit scale of 32-value sub-block ib of an IQ4_XS block, minus 32: low 4 bits from nibble
// ib % 2 of scales_l[ib / 2], high 2 from bits 2 ib of scales_h.
inline int scale_iq4_xs(const block_iq4_xs& b, std::ptrdiff_t ib) noexcept {
  const unsigned scales_h = le16(b.scales_h);
  return static_cast<int>(((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xFu) |
                          (((scales_h >> (2 * ib)) & 3u) << 4)) -
         32;
}

// ---- Decoding: a block's values into y, as ggml's dequantize_row_* ----

template <bool Exact>
inline void decode(const block_q4_0& b, float* y) noexcept {
  const float d = b.d.value();
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((b.qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((b.qs[j] >> 4) - 8);
  }
}
template <bool Exact>
inline void decode(const block_q4_1& b, float* y) noexcept {
  const float d = b.d.value(), m = b.m.value();
  for (int j = 0; j < 16; ++j) {
    y[j] = keep<Exact>(d * static_cast<float>(b.qs[j] & 0x0F)) + m;
    y[j + 16] = keep<Exact>(d * static_cast<float>(b.qs[j] >> 4)) + m;
  }
}
template <bool Exact>
inline void decode(const block_q5_0& b, float* y) noexcept {
  const float d = b.d.value();
  const std::uint32_t qh = le32(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int x0 = static_cast<int>((b.qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16;
    const int x1 = static_cast<int>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
    y[j] = d * static_cast<float>(x0);
    y[j + 16] = d * static_cast<float>(x1);
  }
}
template <bool Exact>
inline void decode(const block_q5_1& b, float* y) noexcept {
  const float d = b.d.value(), m = b.m.value();
  const std::uint32_t qh = le32(b.qh);
  for (int j = 0; j < 16; ++j) {
    const unsigned x0 = (b.qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4);
    const unsigned x1 = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
    y[j] = keep<Exact>(d * static_cast<float>(x0)) + m;
    y[j + 16] = keep<Exact>(d * static_cast<float>(x1)) + m;
  }
}
template <bool Exact>
inline void decode(const block_q8_0& b, float* y) noexcept {
  const float d = b.d.value();
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(as_int8(b.qs[j]));
}
template <bool Exact>
inline void decode(const block_q2_k& b, float* y) noexcept {
  const float d = b.d.value(), dmin = b.dmin.value();
  const unsigned char* q = b.qs;
  int is = 0;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_ = 0; half_ < 2; ++half_) {
        const unsigned sc = b.scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF);
        const float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) {
          const unsigned v = (q[l + 16 * half_] >> shift) & 3u;
          *y++ = keep<Exact>(dl * static_cast<float>(v)) - ml;
        }
      }
    }
  }
}
template <bool Exact>
inline void decode(const block_q3_k& b, float* y) noexcept {
  float dl[16];
  group_scales_q3_k(b, dl);
  const unsigned char* q = b.qs;
  int is = 0;
  unsigned m = 1;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
      for (int half_ = 0; half_ < 2; ++half_) {
        const float s = dl[is++];
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * half_;
          const int v = static_cast<int>((q[k] >> shift) & 3u) - ((b.hmask[k] & m) ? 0 : 4);
          *y++ = s * static_cast<float>(v);
        }
      }
    }
  }
}
template <bool Exact>
inline void decode(const block_q4_k& b, float* y) noexcept {
  const float d = b.d.value(), dmin = b.dmin.value();
  const unsigned char* q = b.qs;
  for (int is = 0; is < 8; is += 2, q += 32) {
    unsigned s, m;
    scale_min_k4(is, b.scales, s, m);
    const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(m);
    scale_min_k4(is + 1, b.scales, s, m);
    const float d2 = d * static_cast<float>(s), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = keep<Exact>(d1 * static_cast<float>(q[l] & 0xF)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = keep<Exact>(d2 * static_cast<float>(q[l] >> 4)) - m2;
  }
}
template <bool Exact>
inline void decode(const block_q5_k& b, float* y) noexcept {
  const float d = b.d.value(), dmin = b.dmin.value();
  const unsigned char* ql = b.qs;
  unsigned u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
    unsigned s, m;
    scale_min_k4(is, b.scales, s, m);
    const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(m);
    scale_min_k4(is + 1, b.scales, s, m);
    const float d2 = d * static_cast<float>(s), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      const unsigned v = (ql[l] & 0xFu) + ((b.qh[l] & u1) ? 16u : 0u);
      *y++ = keep<Exact>(d1 * static_cast<float>(v)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const unsigned v = (ql[l] >> 4) + ((b.qh[l] & u2) ? 16u : 0u);
      *y++ = keep<Exact>(d2 * static_cast<float>(v)) - m2;
    }
  }
}
template <bool Exact>
inline void decode(const block_q6_k& b, float* y) noexcept {
  const float d = b.d.value();
  const unsigned char* ql = b.ql;
  const unsigned char* qh = b.qh;
  const unsigned char* sc = b.scales;
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
    float ds[8];  // the 8 group scales d * sc[k], each rounded once
    for (int k = 0; k < 8; ++k) ds[k] = keep<Exact>(d * static_cast<float>(as_int8(sc[k])));
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
}
template <bool Exact>
inline void decode(const block_iq4_nl& b, float* y) noexcept {
  const float d = b.d.value();
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kvalue_iq4nl(b.qs[j]));
    y[j + 16] = d * static_cast<float>(kvalue_iq4nl(b.qs[j] >> 4u));
  }
}
template <bool Exact>
inline void decode(const block_iq4_xs& b, float* y) noexcept {
  const float d = b.d.value();
  const unsigned char* qs = b.qs;
  for (std::ptrdiff_t ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
    const float dl = d * static_cast<float>(scale_iq4_xs(b, ib));
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kvalue_iq4nl(qs[j]));
      y[j + 16] = dl * static_cast<float>(kvalue_iq4nl(qs[j] >> 4u));
    }
  }
}

// ---- The int8 forms: value n of a block is scale[n / 16] v[n] + min[n / 32] (min 0 where the
// type has none), each product the one ggml's decoding rounds, so rounded(scale v) + min is
// the decoded value exactly. The 8-bit-activation dots take v in integers. ----

template <int Values>
struct int8_form {
  std::int8_t v[Values];
  float scale[Values / 16];  // one a 16-value group
  float min[Values / 32];    // one a 32-value sub-block (0 where the type has no mins)
};

inline void to_int8(const block_q4_0& b, int8_form<32>& f) noexcept {
  for (int j = 0; j < 16; ++j) {
    f.v[j] = static_cast<std::int8_t>((b.qs[j] & 0x0F) - 8);
    f.v[j + 16] = static_cast<std::int8_t>((b.qs[j] >> 4) - 8);
  }
  f.scale[0] = f.scale[1] = b.d.value();
  f.min[0] = 0.0f;
}
inline void to_int8(const block_q4_1& b, int8_form<32>& f) noexcept {
  for (int j = 0; j < 16; ++j) {
    f.v[j] = static_cast<std::int8_t>(b.qs[j] & 0x0F);
    f.v[j + 16] = static_cast<std::int8_t>(b.qs[j] >> 4);
  }
  f.scale[0] = f.scale[1] = b.d.value();
  f.min[0] = b.m.value();
}
template <class Block>
inline void q5_values(const Block& b, int offset, int8_form<32>& f) noexcept {
  const std::uint32_t qh = le32(b.qh);
  for (int j = 0; j < 16; ++j) {
    f.v[j] = static_cast<std::int8_t>(
        static_cast<int>((b.qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4)) - offset);
    f.v[j + 16] = static_cast<std::int8_t>(
        static_cast<int>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - offset);
  }
}
inline void to_int8(const block_q5_0& b, int8_form<32>& f) noexcept {
  q5_values(b, 16, f);
  f.scale[0] = f.scale[1] = b.d.value();
  f.min[0] = 0.0f;
}
inline void to_int8(const block_q5_1& b, int8_form<32>& f) noexcept {
  q5_values(b, 0, f);
  f.scale[0] = f.scale[1] = b.d.value();
  f.min[0] = b.m.value();
}
inline void to_int8(const block_q8_0& b, int8_form<32>& f) noexcept {
  for (int j = 0; j < 32; ++j) f.v[j] = static_cast<std::int8_t>(as_int8(b.qs[j]));
  f.scale[0] = f.scale[1] = b.d.value();
  f.min[0] = 0.0f;
}
inline void to_int8(const block_q3_k& b, int8_form<256>& f) noexcept {
  group_scales_q3_k(b, f.scale);
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {  // dequantize_row_q3_K's value of group 8 n + 2 j + l / 16
        f.v[128 * n + 32 * j + l] = static_cast<std::int8_t>(
            (((b.qs[32 * n + l] >> (2 * j)) & 3) | (((b.hmask[l] >> (4 * n + j)) & 1) << 2)) - 4);
      }
    }
  }
  for (float& m : f.min) m = 0.0f;
}
template <class Block>
inline void k4_scales(const Block& b, int8_form<256>& f) noexcept {
  const float d = b.d.value(), dmin = b.dmin.value();
  for (std::ptrdiff_t j = 0; j < 8; ++j) {
    unsigned sc, mn;
    scale_min_k4(static_cast<int>(j), b.scales, sc, mn);
    f.scale[2 * j] = f.scale[2 * j + 1] = d * static_cast<float>(sc);
    f.min[j] = -(dmin * static_cast<float>(mn));
  }
}
inline void to_int8(const block_q4_k& b, int8_form<256>& f) noexcept {
  k4_scales(b, f);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      f.v[64 * c + l] = static_cast<std::int8_t>(b.qs[32 * c + l] & 0x0F);
      f.v[64 * c + 32 + l] = static_cast<std::int8_t>(b.qs[32 * c + l] >> 4);
    }
  }
}
inline void to_int8(const block_q5_k& b, int8_form<256>& f) noexcept {
  k4_scales(b, f);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      f.v[64 * c + l] =
          static_cast<std::int8_t>((b.qs[32 * c + l] & 0x0F) | (((b.qh[l] >> (2 * c)) & 1) << 4));
      f.v[64 * c + 32 + l] =
          static_cast<std::int8_t>((b.qs[32 * c + l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4));
    }
  }
}
inline void to_int8(const block_q6_k& b, int8_form<256>& f) noexcept {
  const float d = b.d.value();
  for (int g = 0; g < 16; ++g) f.scale[g] = d * static_cast<float>(as_int8(b.scales[g]));
  for (std::ptrdiff_t half_ = 0; half_ < 2; ++half_) {
    const unsigned char* ql = b.ql + 64 * half_;
    const unsigned char* qh = b.qh + 32 * half_;
    for (std::ptrdiff_t qr = 0; qr < 4; ++qr) {
      for (int l = 0; l < 32; ++l) {  // dequantize_row_q6_K's q1 .. q4
        const int byte = qr % 2 == 0 ? ql[l] : ql[l + 32];
        const int nib = qr < 2 ? byte & 0x0F : byte >> 4;
        f.v[128 * half_ + 32 * qr + l] =
            static_cast<std::int8_t>((nib | (((qh[l] >> (2 * qr)) & 3) << 4)) - 32);
      }
    }
  }
  for (float& m : f.min) m = 0.0f;
}
inline void to_int8(const block_iq4_nl& b, int8_form<32>& f) noexcept {
  for (int j = 0; j < 16; ++j) {
    f.v[j] = kvalues_iq4nl[b.qs[j] & 0x0F];
    f.v[j + 16] = kvalues_iq4nl[b.qs[j] >> 4];
  }
  f.scale[0] = f.scale[1] = b.d.value();
  f.min[0] = 0.0f;
}
inline void to_int8(const block_iq4_xs& b, int8_form<256>& f) noexcept {
  const float d = b.d.value();
  for (std::ptrdiff_t ib = 0; ib < 8; ++ib) {
    f.scale[2 * ib] = f.scale[2 * ib + 1] = d * static_cast<float>(scale_iq4_xs(b, ib));
    for (int j = 0; j < 16; ++j) {
      f.v[32 * ib + j] = kvalues_iq4nl[b.qs[16 * ib + j] & 0x0F];
      f.v[32 * ib + j + 16] = kvalues_iq4nl[b.qs[16 * ib + j] >> 4];
    }
    f.min[ib] = 0.0f;
  }
}

}  // namespace detail

// ---- The type -> block map, and the generic kernels over any type ----

/// The block struct of type T (block_for<T>::type), its values, and whether it has an int8
/// form (detail::to_int8).
template <ggml_type T>
struct block_for;
#define PREPACK_GGML_BLOCK(t, block) \
  template <>                        \
  struct block_for<ggml_type::t> {   \
    using type = block;              \
  };
PREPACK_GGML_BLOCK(q4_0, block_q4_0)
PREPACK_GGML_BLOCK(q4_1, block_q4_1)
PREPACK_GGML_BLOCK(q5_0, block_q5_0)
PREPACK_GGML_BLOCK(q5_1, block_q5_1)
PREPACK_GGML_BLOCK(q8_0, block_q8_0)
PREPACK_GGML_BLOCK(q2_k, block_q2_k)
PREPACK_GGML_BLOCK(q3_k, block_q3_k)
PREPACK_GGML_BLOCK(q4_k, block_q4_k)
PREPACK_GGML_BLOCK(q5_k, block_q5_k)
PREPACK_GGML_BLOCK(q6_k, block_q6_k)
PREPACK_GGML_BLOCK(iq4_nl, block_iq4_nl)
PREPACK_GGML_BLOCK(iq4_xs, block_iq4_xs)
#undef PREPACK_GGML_BLOCK

/// Values in a block of T, as the table says (1 for the plain float types).
template <ggml_type T>
inline constexpr int block_values = static_cast<int>(traits(T).block_values);

/// One block of T at p decoded into y[block_values<T>]: Exact, ggml's values bit for bit;
/// otherwise its products free to fuse (within one fp32 rounding).
template <ggml_type T, bool Exact>
inline void decode_block(const unsigned char* p, float* y) noexcept {
  if constexpr (T == ggml_type::f32) {
    std::memcpy(y, p, 4);
  } else if constexpr (T == ggml_type::f16) {
    y[0] = half::to_float(detail::le16(p));
  } else if constexpr (T == ggml_type::bf16) {
    y[0] = bfloat16::to_float(detail::le16(p));
  } else {
    detail::decode<Exact>(block_at<typename block_for<T>::type>(p), y);
  }
}

/// `blocks` blocks of T at src decoded into out (generic). O(values).
template <ggml_type T, bool Exact>
inline void decode_blocks_generic(const unsigned char* src, std::size_t blocks,
                                  float* out) noexcept {
  constexpr std::size_t bytes = traits(T).block_bytes;
  constexpr std::size_t values = traits(T).block_values;
  if constexpr (T == ggml_type::f32) {
    std::memcpy(out, src, blocks * 4);
  } else {
    for (std::size_t k = 0; k < blocks; ++k)
      decode_block<T, Exact>(src + k * bytes, out + k * values);
  }
}

/// y[i] = a_i . row for M activation rows a[M][k] (lda) and one row of T (k a whole number of
/// blocks), generic: each block decoded exactly, then its values' products summed in order.
/// The oracle of the vector fused dots (ggml/arch/x86/dot_f32.hpp). O(M k).
template <ggml_type T, int M>
void dot_f32_generic(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
                     float* y) noexcept {
  constexpr int values = block_values<T>;
  constexpr int chunk = values < 32 ? 32 : values;
  constexpr std::int64_t per = chunk / values;  // blocks decoded at a time
  float w[chunk];
  float acc[M] = {};
  for (std::int64_t j = 0; j < k; j += chunk, p += per * traits(T).block_bytes) {
    const std::int64_t n = std::min<std::int64_t>(chunk, k - j);
    for (std::int64_t b = 0; b < n / values; ++b) {
      decode_block<T, true>(p + b * traits(T).block_bytes, w + b * values);
    }
    for (int i = 0; i < M; ++i) {
      const float* x = a + i * lda + j;
      for (std::int64_t l = 0; l < n; ++l) acc[i] += w[l] * x[l];
    }
  }
  for (int i = 0; i < M; ++i) y[i] = acc[i];
}

// ---- 8-bit activations ----
//
// The activations of a row are quantized per 32-value block b as ggml's quantize_row_q8_0 does:
// d_b = max |x| / 127, q = x / d_b rounded to nearest (ties to even, as ggml's x86 kernels), so
// |x - d_b q| <= d_b / 2 for every value; prepack keeps d_b in fp32 (ggml rounds it to fp16) and
// also keeps each block's exact fp32 sum s_b. A weight block in its int8 form (v, group scales
// g, sub-block mins m) then dots in integers, exactly: d_b (g_0 (v . q)_0 + g_1 (v . q)_1) over
// its two 16-value groups, plus m s_b; so a dot differs from the fp32 one by at most
// sum_b d_b / 2 sum_{i in b} |w_i - m_b| (the bound the tests check), plus fp32 rounding. Each
// row's result depends on that row alone (not on how many rows multiply), so packing and
// batching keep every request equal to running it alone.

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
  // it sums w . q (the AVX512-VNNI int8 dot, the only reader: empty on other builds)
  std::vector<std::int32_t> n4;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__) && defined(__AVX512F__) && \
    defined(__AVX512BW__) && defined(__AVX512VNNI__)  // as PREPACK_GGML_INT8_512 with VNNI
  static constexpr bool lane_sums = true;
#else
  static constexpr bool lane_sums = false;
#endif

  // [rows / 4][pairs of blocks][4 rows][64 bytes of q | 16 int32 | 16 floats], 64-byte aligned:
  // each 4 rows' pairs of blocks laid out for x86::int8_tile_dot (pack_tile), with each
  // four-value lane's -128 times its sum and its block's d; zeros past the rows and the blocks.
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

namespace detail {
// The min terms of a row's dot (m s_b) are summed in 8 chains by block b mod 8, not one: a
// single chain of a dependent FMA a block bounded a row's dot by the FMA's latency. Then the 8
// sums as a tree, the order the vector kernels add 8 lanes in.
inline float int8_tail(const float (&t)[8]) noexcept {
  return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}
}  // namespace detail

/// y[i] = row . a_i for the M activation rows a.q + i0 (int8_rows) and one row of T (a type
/// with an int8 form; k a whole number of blocks), generic: each block's int8 form, then each
/// 16-value group's integer dot, scaled. The fallback where ggml/arch/ has no vector kernel.
/// O(M k).
template <ggml_type T, int M>
void dot_q8_generic(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                    float* y) noexcept {
  using block = typename block_for<T>::type;
  constexpr int values = block_values<T>;
  detail::int8_form<values> f;
  float tails[M][8] = {};
  float acc[M] = {};
  for (std::int64_t e = 0; e < k; e += values, p += sizeof(block)) {
    detail::to_int8(block_at<block>(p), f);
    for (int j = 0; j < values / 32; ++j) {
      const std::int64_t b = e / 32 + j;  // the activations' block
      for (int i = 0; i < M; ++i) {
        const std::int8_t* q = a.q.data() + (i0 + i) * a.cols + b * 32;
        int dot[2] = {0, 0};
        for (int l = 0; l < 32; ++l) dot[l / 16] += f.v[32 * j + l] * q[l];
        const float db = a.d[static_cast<std::size_t>((i0 + i) * (a.cols / 32) + b)];
        acc[i] += db * (f.scale[2 * j] * static_cast<float>(dot[0]) +
                        f.scale[2 * j + 1] * static_cast<float>(dot[1]));
        if (f.min[j] != 0.0f) {
          const float sb = a.s[static_cast<std::size_t>((i0 + i) * (a.cols / 32) + b)];
          tails[i][b % 8] = std::fma(f.min[j], sb, tails[i][b % 8]);
        }
      }
    }
  }
  for (int i = 0; i < M; ++i) y[i] = acc[i] + detail::int8_tail(tails[i]);
}

}  // namespace ggml
PREPACK_NAMESPACE_END
