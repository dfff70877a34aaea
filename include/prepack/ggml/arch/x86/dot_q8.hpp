// prepack/ggml/arch/x86/dot_q8.hpp - int8 dots (8-bit activations, int8_rows) straight from a
// row's blocks, in vectors (AVX2; AVX-512 with BW, and VNNI and VBMI where the CPU has them): the
// vector versions of ggml/quants.hpp's dot_q8_generic, for every type with an int8 form, one
// function per type (or per two types whose blocks are laid out alike) and vector width, named
// for them; dot_q8<T, M> at the end is the one place that says which computes which. Standard
// library and <immintrin.h> only.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "simd.hpp"

PREPACK_NAMESPACE_BEGIN
namespace ggml {
namespace x86 {

/// Whether this build has a vector int8 dot of T (dot_q8 below).
template <ggml_type T>
inline constexpr bool has_dot_q8 = PREPACK_GGML_INT8&& traits(T).int8_dot&& has_int8_values<T>;

#if PREPACK_GGML_INT8_512
// The int8 dots where vectors are 512 bits wide: two 32-value blocks a vector, lanes 0-7 the
// even block's and 8-15 the odd one's, so acc[i] holds the 8-lane path's two accumulators side
// by side and every lane sums the same products in the same order (results equal that path's to
// the bit) with about half the instructions. Where the CPU permutes bytes across two vectors
// (AVX512-VBMI) the 32-value formats take four blocks a step and gather their fp16 scales (and
// Q4_0's, Q4_1's nibbles) with one permute each instead of a scalar load and conversion a
// block. An odd last block takes the even lanes alone. O(M k) each.

// [lo | hi]
inline __m512i halves512(__m256i lo, __m256i hi) noexcept {
  return _mm512_maskz_inserti64x4(0xFF, _mm512_zextsi256_si512(lo), hi, 1);
}
// [x0 in lanes 0-7 | x1 in 8-15]
inline __m512 pair16(float x0, float x1) noexcept {
  return _mm512_mask_broadcastss_ps(_mm512_set1_ps(x0), 0xFF00, _mm_set_ss(x1));
}
// The 16 nibble bytes of blocks b and b + 1 at q0, q1: [q0's low | q0's high | q1's low |
// q1's high] nibbles, the order of their 64 activations.
inline __m512i nibbles2(const unsigned char* q0, const unsigned char* q1) noexcept {
  const __m256i t = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q1)),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0)));
  const __m512i u = halves512(t, _mm256_srli_epi16(t, 4));  // q0, q1, q0 >> 4, q1 >> 4
  return _mm512_and_si512(_mm512_maskz_shuffle_i64x2(0xFF, u, u, 0xD8), _mm512_set1_epi8(0x0F));
}

/// The 512-bit int8 dots' M activation rows (a.q + i0 ...) and their accumulators.
template <int M>
struct int8_rows512 {
  const std::int8_t* aq[M];
  const float* ad[M];
  const float* as[M];
#if defined(__AVX512VNNI__)
  const std::int32_t* an[M];
#endif
  __m512 acc[M];

  int8_rows512(const int8_rows& a, std::int64_t i0) noexcept {
    for (int i = 0; i < M; ++i) {
      aq[i] = a.q.data() + (i0 + i) * a.cols;
      ad[i] = a.d.data() + (i0 + i) * (a.cols / 32);
      as[i] = a.s.data() + (i0 + i) * (a.cols / 32);
#if defined(__AVX512VNNI__)
      an[i] = a.n4.data() + (i0 + i) * (a.cols / 4);
#endif
      acc[i] = _mm512_setzero_ps();
    }
  }
  // Row i's activation blocks b and b + 1 (b's alone, the rest zero, where `one`).
  __m512i act2(int i, std::int64_t b, bool one) const noexcept {
    const std::int8_t* q = aq[i] + b * 32;
    return one ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)))
               : _mm512_loadu_si512(q);
  }
  // acc[i] += v * s lane-wise (the even lanes alone where `one`).
  void add(int i, __m512i v, __m512 s, bool one) noexcept {
    acc[i] = _mm512_mask3_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, v), s, acc[i],
                                   one ? __mmask16{0x00FF} : __mmask16{0xFFFF});
  }
  // Signed weight bytes w against blocks b, b + 1: |w| . (a with w's sign), which is w . a in
  // every lane exactly as the 8-lane path's _mm256_sign_epi8 pair gives it (a is never -128;
  // where w is 0 both give a zero product). scale(i): the lanes' scales for activation row i.
  template <class Scale>
  void signed_pair(__m512i w, std::int64_t b, bool one, Scale scale) noexcept {
    const __m512i aw = _mm512_abs_epi8(w);
    const __mmask64 neg = _mm512_movepi8_mask(w);
    for (int i = 0; i < M; ++i) {
      const __m512i x = act2(i, b, one);
      add(i, int8_dot_us512(aw, _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x)), scale(i),
          one);
    }
  }
  template <class Scale>
  void unsigned_pair(__m512i u, std::int64_t b, bool one, Scale scale) noexcept {
    for (int i = 0; i < M; ++i) add(i, int8_dot_us512(u, act2(i, b, one)), scale(i), one);
  }
  // Q4_0's nibbles u = w + 8 (unsigned) against blocks b, b + 1. With VNNI each lane's dot
  // starts from 8 times minus the sum of its 4 activations (int8_rows::n4), so it ends at w . a,
  // the same integer signed_pair gives, in one instruction instead of five (Q4_0 decode 8%
  // faster; Q8_0's and Q6_K's bytes, loaded a pair at a time, measured slower or level so);
  // without, signed_pair on w.
  template <class Scale>
  void offset8_pair(__m512i u, std::int64_t b, bool one, Scale scale) noexcept {
#if defined(__AVX512VNNI__)
    for (int i = 0; i < M; ++i) {
      const __m512i o = _mm512_slli_epi32(
          _mm512_maskz_loadu_epi32(one ? __mmask16{0x00FF} : __mmask16{0xFFFF}, an[i] + b * 8), 3);
      add(i, _mm512_dpbusd_epi32(o, u, act2(i, b, one)), scale(i), one);
    }
#else
    signed_pair(_mm512_sub_epi8(u, _mm512_set1_epi8(8)), b, one, scale);
#endif
  }
  // The lanes' scales d_w d_a of blocks b, b + 1 (fp16 d_w at q0, q1) for activation row i.
  auto block_scales(const unsigned char* q0, const unsigned char* q1, std::int64_t b,
                    bool one) const noexcept {
    const float d0 = fp16(q0), d1 = fp16(q1);
    return [this, d0, d1, b, one](int i) {
      return pair16(d0 * ad[i][b], one ? 0.0f : d1 * ad[i][b + 1]);
    };
  }
#if defined(__AVX512VBMI__)
  // The four fp16 scales at `index` of 4 blocks of w as floats, times each activation row's
  // (lanes 0-3); spread() takes them to two blocks a vector.
  void quad_scales(const __m512i (&w)[2], const __m512i& index, std::int64_t b,
                   __m128 (&s)[M]) const noexcept {
    const __m128 d =
        _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(w[0], index, w[1])));
    for (int i = 0; i < M; ++i) s[i] = _mm_mul_ps(d, _mm_loadu_ps(ad[i] + b));
  }
#endif
  // y[i]: the accumulators summed, plus the mins' terms (int8_tail) of the types that have them
  // (tails[i][b % 8]: a local array of the kernel's, not a member, so that its stores at run-time
  // indices cannot alias the accumulators and keep them out of registers).
  void sum(float* y, const float (*tails)[8] = nullptr) const noexcept {
    for (int i = 0; i < M; ++i) {
      const __m512d v = _mm512_castps_pd(acc[i]);
      const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, v, 0));
      const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, v, 1));
      y[i] = int8_sum(_mm256_add_ps(lo, hi)) + (tails ? detail::int8_tail(tails[i]) : 0.0f);
    }
  }
};

#if defined(__AVX512VBMI__)
// Four blocks a step (`bytes` each, 4 bytes <= 128) of the nb at p: quad(w, b) with w the 128
// bytes from block b (two vectors); returns the first block the pairs take on from.
template <class Quad>
inline std::int64_t block_quads(const unsigned char* p, std::int64_t nb, std::int64_t bytes,
                                Quad&& quad) {
  std::int64_t b = 0;
  for (; b + 4 <= nb && (nb - b) * bytes >= 128; b += 4) {
    const unsigned char* q = p + b * bytes;
    const __m512i w[2] = {_mm512_loadu_si512(q), _mm512_loadu_si512(q + 64)};
    quad(w, b);
  }
  return b;
}
// Bytes [off, off + n) of each of 4 blocks of `bytes`, one after another, as a byte index.
inline __m512i gather_index(int bytes, int off, int n) noexcept {
  alignas(64) unsigned char idx[64] = {};
  for (int j = 0; j < 4; ++j) {
    for (int t = 0; t < n; ++t) idx[j * n + t] = static_cast<unsigned char>(j * bytes + off + t);
  }
  return _mm512_load_si512(idx);
}
// quad_scales' lanes spread to two blocks a vector: blocks 0 and 1 of the four (first2), or 2
// and 3 (last2).
inline __m512i first2() noexcept {
  return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
}
inline __m512i last2() noexcept {
  return _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
}
inline __m512 spread(__m128 s, const __m512i& which) noexcept {
  return _mm512_permutexvar_ps(which, _mm512_broadcast_f32x4(s));
}
// Q4_0 / Q4_1: [b's low | b's high | b+1's low | b+1's high] and the same for b + 2, b + 3
// from 4 blocks' nibbles (16 bytes at `off` of each) in one vector n.
inline void split(__m512i n, __m512i (&q)[2]) noexcept {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_and_si512(n, low4);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(n, 4), low4);
  q[0] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi);
  q[1] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), hi);
}
#endif

// The 16-value group formats (Q6_K, Q3_K): lane l of a pair of blocks' vector takes group
// 4 q + l / 4 of the 16 (the pair q = 0 .. 3 of the 256 values); group g lies in activation
// block g / 2 (block_of).
struct group_lanes {
  __m512i groups[4] = {
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4),
      _mm512_set_epi32(11, 11, 11, 11, 10, 10, 10, 10, 9, 9, 9, 9, 8, 8, 8, 8),
      _mm512_set_epi32(15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12)};
  __m512i block_of = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
};

/// Q8_0.
template <int M>
__attribute__((flatten)) void dot_q8_512_q8_0(const unsigned char* p, std::int64_t k,
                                              const int8_rows& a, std::int64_t i0,
                                              float* y) noexcept {
  int8_rows512<M> r(a, i0);
  const std::int64_t nb = k / 32;
  std::int64_t b0 = 0;
#if defined(__AVX512VBMI__)
  const __m512i scale_at = gather_index(sizeof(block_q8_0), offsetof(block_q8_0, d), 2);
  b0 = block_quads(p, nb, sizeof(block_q8_0), [&](const __m512i(&w)[2], std::int64_t b) {
    __m128 s[M];
    r.quad_scales(w, scale_at, b, s);
    const unsigned char* q = p + b * std::int64_t{sizeof(block_q8_0)};
    r.signed_pair(halves512(load32(q + offsetof(block_q8_0, qs)),
                            load32(q + sizeof(block_q8_0) + offsetof(block_q8_0, qs))),
                  b, false, [&](int i) { return spread(s[i], first2()); });
    r.signed_pair(halves512(load32(q + 2 * sizeof(block_q8_0) + offsetof(block_q8_0, qs)),
                            load32(q + 3 * sizeof(block_q8_0) + offsetof(block_q8_0, qs))),
                  b + 2, false, [&](int i) { return spread(s[i], last2()); });
  });
#endif
  for_block_pairs(p, nb, sizeof(block_q8_0), b0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    r.signed_pair(halves512(load32(block_at<block_q8_0>(q0).qs),
                                            load32(block_at<block_q8_0>(q1).qs)),
                                  b, one, r.block_scales(q0, q1, b, one));
                  });
  r.sum(y);
}

/// Q4_0.
template <int M>
__attribute__((flatten)) void dot_q8_512_q4_0(const unsigned char* p, std::int64_t k,
                                              const int8_rows& a, std::int64_t i0,
                                              float* y) noexcept {
  int8_rows512<M> r(a, i0);
  const std::int64_t nb = k / 32;
  std::int64_t b0 = 0;
#if defined(__AVX512VBMI__)
  const __m512i scale_at = gather_index(sizeof(block_q4_0), offsetof(block_q4_0, d), 2),
                nibbles_at = gather_index(sizeof(block_q4_0), offsetof(block_q4_0, qs), 16);
  b0 = block_quads(p, nb, sizeof(block_q4_0), [&](const __m512i(&w)[2], std::int64_t b) {
    __m128 s[M];
    r.quad_scales(w, scale_at, b, s);
    __m512i q[2];
    split(_mm512_permutex2var_epi8(w[0], nibbles_at, w[1]), q);
    r.offset8_pair(q[0], b, false, [&](int i) { return spread(s[i], first2()); });
    r.offset8_pair(q[1], b + 2, false, [&](int i) { return spread(s[i], last2()); });
  });
#endif
  for_block_pairs(p, nb, sizeof(block_q4_0), b0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    r.offset8_pair(
                        nibbles2(block_at<block_q4_0>(q0).qs, block_at<block_q4_0>(q1).qs), b, one,
                        r.block_scales(q0, q1, b, one));
                  });
  r.sum(y);
}

/// Q5_0 and Q5_1: 5-bit q (q5_values32), Q5_0's q - 16 as Q8_0, Q5_1's q as Q4_1's.
template <ggml_type T, int M>
__attribute__((flatten)) void dot_q8_512_q5_0_q5_1(const unsigned char* p, std::int64_t k,
                                                   const int8_rows& a, std::int64_t i0,
                                                   float* y) noexcept {
  static_assert(T == ggml_type::q5_0 || T == ggml_type::q5_1);
  int8_rows512<M> r(a, i0);
  float tails[M][8] = {};  // the mins times the blocks' sums (int8_tail)
  const std::int64_t nb = k / 32;
  constexpr bool q51 = T == ggml_type::q5_1;
  const auto values = [&](const unsigned char* q) {
    return q51 ? q5_values32(block_at<block_q5_1>(q).qh, block_at<block_q5_1>(q).qs)
               : q5_values32(block_at<block_q5_0>(q).qh, block_at<block_q5_0>(q).qs);
  };
  for_block_pairs(p, nb, q51 ? 24 : 22, 0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    const __m512i u = halves512(values(q0), values(q1));
                    if (!q51) {
                      r.signed_pair(_mm512_sub_epi8(u, _mm512_set1_epi8(16)), b, one,
                                    r.block_scales(q0, q1, b, one));
                      return;
                    }
                    r.unsigned_pair(u, b, one, r.block_scales(q0, q1, b, one));
                    for (std::int64_t e = b; e < b + (one ? 1 : 2); ++e) {
                      const float m = fp16(block_at<block_q5_1>(e == b ? q0 : q1).m.b);
                      for (int i = 0; i < M; ++i)
                        tails[i][e % 8] = std::fma(m, r.as[i][e], tails[i][e % 8]);
                    }
                  });
  r.sum(y, tails);
}

/// IQ4_NL: the indices looked up as int8 kvalues_iq4nl, then as Q8_0.
template <int M>
__attribute__((flatten)) void dot_q8_512_iq4_nl(const unsigned char* p, std::int64_t k,
                                                const int8_rows& a, std::int64_t i0,
                                                float* y) noexcept {
  int8_rows512<M> r(a, i0);
  const std::int64_t nb = k / 32;
  const __m512i table = _mm512_maskz_broadcast_i32x4(0xFFFF, kvalues16());
  for_block_pairs(p, nb, sizeof(block_iq4_nl), 0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    r.signed_pair(
                        _mm512_shuffle_epi8(table, nibbles2(block_at<block_iq4_nl>(q0).qs,
                                                            block_at<block_iq4_nl>(q1).qs)),
                        b, one, r.block_scales(q0, q1, b, one));
                  });
  r.sum(y);
}

/// IQ4_XS: IQ4_NL's values, a scale d (ls - 32) each 32-value sub-block.
template <int M>
__attribute__((flatten)) void dot_q8_512_iq4_xs(const unsigned char* p, std::int64_t k,
                                                const int8_rows& a, std::int64_t i0,
                                                float* y) noexcept {
  int8_rows512<M> r(a, i0);
  const __m512i table = _mm512_maskz_broadcast_i32x4(0xFFFF, kvalues16());
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += sizeof(block_iq4_xs)) {
    const auto& blk = block_at<block_iq4_xs>(p);
    const float d = fp16(blk.d.b);
    for (std::ptrdiff_t ib = 0; ib < 8; ib += 2) {
      const float d0 = d * static_cast<float>(detail::scale_iq4_xs(blk, ib)),
                  d1 = d * static_cast<float>(detail::scale_iq4_xs(blk, ib + 1));
      const std::int64_t b = sb * 8 + ib;
      r.signed_pair(_mm512_shuffle_epi8(table, nibbles2(blk.qs + 16 * ib, blk.qs + 16 * ib + 16)),
                    b, false, [&](int i) { return pair16(d0 * r.ad[i][b], d1 * r.ad[i][b + 1]); });
    }
  }
  r.sum(y);
}

/// Q4_1.
template <int M>
__attribute__((flatten)) void dot_q8_512_q4_1(const unsigned char* p, std::int64_t k,
                                              const int8_rows& a, std::int64_t i0,
                                              float* y) noexcept {
  int8_rows512<M> r(a, i0);
  float tails[M][8] = {};  // the mins times the blocks' sums (int8_tail)
  const std::int64_t nb = k / 32;
  const auto mins = [&](const unsigned char* q, std::int64_t b) {
    const float m = fp16(block_at<block_q4_1>(q).m.b);
    for (int i = 0; i < M; ++i) tails[i][b % 8] = std::fma(m, r.as[i][b], tails[i][b % 8]);
  };
  std::int64_t b0 = 0;
#if defined(__AVX512VBMI__)
  const __m512i scale_at = gather_index(sizeof(block_q4_1), offsetof(block_q4_1, d), 2),
                nibbles_at = gather_index(sizeof(block_q4_1), offsetof(block_q4_1, qs), 16);
  const __m512i min_at = gather_index(sizeof(block_q4_1), offsetof(block_q4_1, m), 2);
  // the chains of blocks b mod 8 = 0 .. 3 and 4 .. 7 (the lanes of tails), in registers
  __m128 t[M][2];
  for (int i = 0; i < M; ++i) t[i][0] = t[i][1] = _mm_setzero_ps();
  b0 = block_quads(p, nb, sizeof(block_q4_1), [&](const __m512i(&w)[2], std::int64_t b) {
    __m128 s[M];
    r.quad_scales(w, scale_at, b, s);
    __m512i q[2];
    split(_mm512_permutex2var_epi8(w[0], nibbles_at, w[1]), q);
    r.unsigned_pair(q[0], b, false, [&](int i) { return spread(s[i], first2()); });
    r.unsigned_pair(q[1], b + 2, false, [&](int i) { return spread(s[i], last2()); });
    const __m128 m =
        _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(w[0], min_at, w[1])));
    const int half = b % 8 == 0 ? 0 : 1;
    for (int i = 0; i < M; ++i) {
      t[i][half] = _mm_fmadd_ps(m, _mm_loadu_ps(r.as[i] + b), t[i][half]);
    }
  });
  for (int i = 0; i < M; ++i) {
    _mm_storeu_ps(tails[i], t[i][0]);
    _mm_storeu_ps(tails[i] + 4, t[i][1]);
  }
#endif
  for_block_pairs(p, nb, sizeof(block_q4_1), b0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    r.unsigned_pair(
                        nibbles2(block_at<block_q4_1>(q0).qs, block_at<block_q4_1>(q1).qs), b, one,
                        r.block_scales(q0, q1, b, one));
                    mins(q0, b);
                    if (!one) mins(q1, b + 1);
                  });
  r.sum(y, tails);
}

/// Q4_K and Q5_K.
template <ggml_type T, int M>
__attribute__((flatten)) void dot_q8_512_q4_k_q5_k(const unsigned char* p, std::int64_t k,
                                                   const int8_rows& a, std::int64_t i0,
                                                   float* y) noexcept {
  static_assert(T == ggml_type::q4_k || T == ggml_type::q5_k);
  int8_rows512<M> r(a, i0);
  float tails[M][8] = {};  // the mins times the blocks' sums (int8_tail)
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // Q5_K: Q4_K's scales and nibbles (after 32 bytes of fifth bits: bit j of byte l is value
  // l's of sub-block j), each value its nibble + 16 where that bit is set
  constexpr bool q5 = T == ggml_type::q5_k;
  constexpr std::int64_t bytes = q5 ? sizeof(block_q5_k) : sizeof(block_q4_k);
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
    const __m128i sm = q4k_scale_bytes(block_at<block_q4_k>(p).scales);
    // lanes 0-7: d sc_j, 8-15: dmin m_j (each product rounded once)
    const __m512 dm = _mm512_mul_ps(
        pair16(fp16(block_at<block_q4_k>(p).d.b), fp16(block_at<block_q4_k>(p).dmin.b)),
        _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_cvtepu8_epi32(sm)));
    __m512 s[M];  // lanes 0-7: d sc_j d_a of sub-block j, for each activation row
    for (int i = 0; i < M; ++i) {
      const __m512 a8 = _mm512_maskz_loadu_ps(0xFF, r.ad[i] + sb * 8);
      s[i] = _mm512_mul_ps(dm, a8);
      t[i] = _mm512_mask3_fnmadd_ps(
          dm, _mm512_permutexvar_ps(to_mins, _mm512_maskz_loadu_ps(0xFF, r.as[i] + sb * 8)), t[i],
          0xFF00);
    }
    // Q5_K: the fifth bits of sub-blocks 2c (low half) and 2c + 1 (high), at bit 0 of each
    // byte at step c (16-bit shifts: a byte's bit 0 is its own bit 2c or 2c + 1)
    const __m256i h = q5 ? load32(block_at<block_q5_k>(p).qh) : _mm256_setzero_si256();
    __m512i fifth = halves512(h, _mm256_srli_epi16(h, 1));
    for (std::ptrdiff_t c = 0; c < 4; ++c) {  // 32 bytes: sub-block 2c's low nibbles, 2c + 1's high
      const __m256i v =
          load32((q5 ? block_at<block_q5_k>(p).qs : block_at<block_q4_k>(p).qs) + 32 * c);
      __m512i u = _mm512_and_si512(halves512(v, _mm256_srli_epi16(v, 4)), low4);
      if (q5) {
        u = _mm512_or_si512(u, _mm512_and_si512(_mm512_slli_epi16(fifth, 4), bit4));
        fifth = _mm512_srli_epi16(fifth, 2);
      }
      r.unsigned_pair(u, sb * 8 + 2 * c, false,
                      [&](int i) { return _mm512_permutexvar_ps(subs[c], s[i]); });
    }
  }
  for (int i = 0; i < M; ++i) {
    _mm256_storeu_ps(
        tails[i], _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(t[i]), 1)));
  }
  r.sum(y, tails);
}

/// Q3_K.
template <int M>
__attribute__((flatten)) void dot_q8_512_q3_k(const unsigned char* p, std::int64_t k,
                                              const int8_rows& a, std::int64_t i0,
                                              float* y) noexcept {
  int8_rows512<M> r(a, i0);
  const group_lanes lanes;
  // 256 values as 16-value groups (q3k_group_scales): at 128-value half n and j = 0 .. 3,
  // 32 bytes of 3-bit values w + 4 (2 bits of q[32 n + l] at 2 j, bit 4 n + j of hm[l] above
  // them), two groups and one activation block; blocks 2 jj and 2 jj + 1 a pair
  const __m256i three = _mm256_set1_epi8(3), one_bit = _mm256_set1_epi8(1);
  const __m512i four = _mm512_set1_epi8(4);
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += sizeof(block_q3_k)) {
    float dl[16];
    detail::group_scales_q3_k(block_at<block_q3_k>(p), dl);
    const __m512 g = _mm512_loadu_ps(dl);
    __m512 s[M];  // lane g: d (s_g - 32) d_a of group g's block, for each activation row
    for (int i = 0; i < M; ++i) {
      s[i] = _mm512_mul_ps(
          g, _mm512_permutexvar_ps(lanes.block_of, _mm512_maskz_loadu_ps(0xFF, r.ad[i] + sb * 8)));
    }
    const __m256i hm = load32(p);
    for (std::ptrdiff_t n = 0; n < 2; ++n) {
      const __m256i q = load32(block_at<block_q3_k>(p).qs + 32 * n);
      const auto values = [&](std::ptrdiff_t j) {
        const __m256i low = _mm256_and_si256(
            _mm256_srl_epi16(q, _mm_cvtsi32_si128(static_cast<int>(2 * j))), three);
        const __m256i high = _mm256_and_si256(
            _mm256_srl_epi16(hm, _mm_cvtsi32_si128(static_cast<int>(4 * n + j))), one_bit);
        return _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
      };
      for (std::ptrdiff_t jj = 0; jj < 2; ++jj) {
        r.signed_pair(_mm512_sub_epi8(halves512(values(2 * jj), values(2 * jj + 1)), four),
                      sb * 8 + 4 * n + 2 * jj, false,
                      [&](int i) { return _mm512_permutexvar_ps(lanes.groups[2 * n + jj], s[i]); });
      }
    }
  }
  r.sum(y);
}

/// Q6_K.
template <int M>
__attribute__((flatten)) void dot_q8_512_q6_k(const unsigned char* p, std::int64_t k,
                                              const int8_rows& a, std::int64_t i0,
                                              float* y) noexcept {
  int8_rows512<M> r(a, i0);
  const group_lanes lanes;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i three0 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += sizeof(block_q6_k)) {
    // d sc_g of the 16 groups (each product rounded once, as decoding gives it), times
    // each activation row's d_a of the group's block
    const __m512 g = _mm512_mul_ps(
        _mm512_set1_ps(fp16(block_at<block_q6_k>(p).d.b)),
        _mm512_maskz_cvtepi32_ps(
            0xFFFF, _mm512_cvtepi8_epi32(_mm_loadu_si128(
                        reinterpret_cast<const __m128i*>(block_at<block_q6_k>(p).scales)))));
    __m512 s[M];
    for (int i = 0; i < M; ++i) {
      s[i] = _mm512_mul_ps(
          g, _mm512_permutexvar_ps(lanes.block_of, _mm512_maskz_loadu_ps(0xFF, r.ad[i] + sb * 8)));
    }
    for (std::ptrdiff_t half = 0; half < 2; ++half) {
      const __m256i h = load32(block_at<block_q6_k>(p).qh + 32 * half);
      const __m512i lh =
          _mm512_loadu_si512(block_at<block_q6_k>(p).ql + 64 * half);  // [low bytes | high bytes]
      const __m512i ha = halves512(_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2));
      const __m512i hb = halves512(h, _mm256_srli_epi16(h, 2));
      const __m512i q01 = _mm512_or_si512(_mm512_and_si512(lh, low4), _mm512_and_si512(ha, three0));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lh, 4), low4),
                                          _mm512_and_si512(hb, three0));
      const std::int64_t b = sb * 8 + half * 4;
      r.signed_pair(_mm512_sub_epi8(q01, bias), b, false,
                    [&](int i) { return _mm512_permutexvar_ps(lanes.groups[2 * half], s[i]); });
      r.signed_pair(_mm512_sub_epi8(q23, bias), b + 2, false,
                    [&](int i) { return _mm512_permutexvar_ps(lanes.groups[2 * half + 1], s[i]); });
    }
  }
  r.sum(y);
}
#endif

#if PREPACK_GGML_INT8 && !PREPACK_GGML_INT8_512
// The int8 dots where vectors are 256 bits wide (AVX2): each 32-value block's products summed
// in 8 int32 lanes, scaled by d_w d_a into two fp32 accumulators a row (even blocks into one,
// odd ones into the other). O(M k) each.

/// The 256-bit int8 dots' M activation rows (a.q + i0 ...) and their accumulators.
template <int M>
struct int8_rows256 {
  const std::int8_t* aq[M];
  const float* ad[M];
  const float* as[M];
  __m256 acc[M][2];

  int8_rows256(const int8_rows& a, std::int64_t i0) noexcept {
    for (int i = 0; i < M; ++i) {
      aq[i] = a.q.data() + (i0 + i) * a.cols;
      ad[i] = a.d.data() + (i0 + i) * (a.cols / 32);
      as[i] = a.s.data() + (i0 + i) * (a.cols / 32);
      acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
  }
  __m256i act(int i, std::int64_t b) const noexcept {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq[i] + b * 32));
  }
  // 32 signed weight bytes w against each row's block b: d_w d_b (w . q) into accumulator U
  // (U: std::integral_constant<int, 0 or 1>).
  template <class U>
  void signed_block(__m256i w, std::int64_t b, float dw, U) noexcept {
    const __m256i aw = _mm256_sign_epi8(w, w);
    for (int i = 0; i < M; ++i) {
      const __m256i v = int8_dot_us(aw, _mm256_sign_epi8(act(i, b), w));
      acc[i][U::value] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(dw * ad[i][b]), acc[i][U::value]);
    }
  }
  // 32 signed weight bytes w of block b in two 16-value groups scaled g0 and g1 (Q6_K, Q3_K):
  // g d_b (w . q) over each group's lanes, into accumulator U.
  template <class U>
  void grouped_block(__m256i w, std::int64_t b, float g0, float g1, U) noexcept {
    const __m256i aw = _mm256_sign_epi8(w, w);
    const __m256 g = _mm256_set_m128(_mm_set1_ps(g1), _mm_set1_ps(g0));
    for (int i = 0; i < M; ++i) {
      const __m256i v = int8_dot_us(aw, _mm256_sign_epi8(act(i, b), w));
      acc[i][U::value] = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(v), _mm256_mul_ps(g, _mm256_set1_ps(ad[i][b])), acc[i][U::value]);
    }
  }
  // 32 unsigned weight bytes (nibbles) u: scale d_w d_b (u . q).
  template <class U>
  void unsigned_block(__m256i u, std::int64_t b, float dw, U) noexcept {
    for (int i = 0; i < M; ++i) {
      const __m256i v = int8_dot_us(u, act(i, b));
      acc[i][U::value] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(dw * ad[i][b]), acc[i][U::value]);
    }
  }
  // Q4_K's mins against the blocks' exact sums (int8_tail), one rounding per term whatever M
  // (a contracted or split a * b + c would differ between instantiations).
  void q4k_mins(std::int64_t sb, const float (&dmn)[8], float (&tails)[M][8]) const noexcept {
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < 8; ++j) tails[i][j] = std::fma(-dmn[j], as[i][sb * 8 + j], tails[i][j]);
    }
  }
  // y[i]: the accumulators summed, plus the mins' terms (int8_tail) of the types that have them
  // (a local array of the kernel's, as int8_rows512::sum says).
  void sum(float* y, const float (*tails)[8] = nullptr) const noexcept {
    for (int i = 0; i < M; ++i) {
      y[i] = int8_sum(_mm256_add_ps(acc[i][0], acc[i][1])) +
             (tails ? detail::int8_tail(tails[i]) : 0.0f);
    }
  }
};

using even = std::integral_constant<int, 0>;
using odd = std::integral_constant<int, 1>;

// 16 bytes at q16: their low nibbles, then their high ones.
inline __m256i nibbles256(const unsigned char* q16) noexcept {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q16));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
// The 32-value block formats (nb blocks of `bytes` at p): block(q, b, accumulator) for every
// block, two a step, the even one into accumulator 0 and the odd one into 1, then an odd last.
template <class Block>
inline void two_blocks_a_step(const unsigned char* p, std::int64_t nb, std::int64_t bytes,
                              Block&& block) {
  for_block_pairs(p, nb, bytes, 0,
                  [&](const unsigned char* q0, const unsigned char* q1, std::int64_t b, bool one) {
                    block(q0, b, even{});
                    if (!one) block(q1, b + 1, odd{});
                  });
}
// Each sub-block's d sc_j and dmin m_j of a Q4_K (or Q5_K) block at q.
inline void q4k_int8_scales(const unsigned char* q, float d, float dmin, float (&dsc)[8],
                            float (&dmn)[8]) noexcept {
  for (int j = 0; j < 8; ++j) {
    unsigned sc, mn;
    detail::scale_min_k4(j, block_at<block_q4_k>(q).scales, sc, mn);
    dsc[j] = d * static_cast<float>(sc);
    dmn[j] = dmin * static_cast<float>(mn);
  }
}

/// Q8_0.
template <int M>
void dot_q8_256_q8_0(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                     float* y) noexcept {
  int8_rows256<M> r(a, i0);
  two_blocks_a_step(
      p, k / 32, sizeof(block_q8_0), [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        const __m256i w =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_at<block_q8_0>(q).qs));
        r.signed_block(w, b, fp16(q), u_acc);
      });
  r.sum(y);
}

/// Q4_0.
template <int M>
void dot_q8_256_q4_0(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                     float* y) noexcept {
  int8_rows256<M> r(a, i0);
  const __m256i eight = _mm256_set1_epi8(8);
  two_blocks_a_step(p, k / 32, sizeof(block_q4_0),
                    [&](const unsigned char* q, std::int64_t b, auto u_acc) {
                      r.signed_block(_mm256_sub_epi8(nibbles256(block_at<block_q4_0>(q).qs), eight),
                                     b, fp16(q), u_acc);
                    });
  r.sum(y);
}

/// Q5_0.
template <int M>
void dot_q8_256_q5_0(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                     float* y) noexcept {
  int8_rows256<M> r(a, i0);
  two_blocks_a_step(
      p, k / 32, sizeof(block_q5_0), [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        r.signed_block(
            _mm256_sub_epi8(q5_values32(block_at<block_q5_0>(q).qh, block_at<block_q5_0>(q).qs),
                            _mm256_set1_epi8(16)),
            b, fp16(q), u_acc);
      });
  r.sum(y);
}

/// Q5_1.
template <int M>
void dot_q8_256_q5_1(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                     float* y) noexcept {
  int8_rows256<M> r(a, i0);
  float tails[M][8] = {};  // the mins times the blocks' sums (int8_tail)
  two_blocks_a_step(
      p, k / 32, sizeof(block_q5_1), [&](const unsigned char* q, std::int64_t b, auto u_acc) {
        r.unsigned_block(q5_values32(block_at<block_q5_1>(q).qh, block_at<block_q5_1>(q).qs), b,
                         fp16(q), u_acc);
        const float mw = fp16(block_at<block_q5_1>(q).m.b);
        for (int i = 0; i < M; ++i) tails[i][b % 8] = std::fma(mw, r.as[i][b], tails[i][b % 8]);
      });
  r.sum(y, tails);
}

/// IQ4_NL and IQ4_XS: the indices looked up as int8 kvalues_iq4nl, then as Q8_0.
template <ggml_type T, int M>
void dot_q8_256_iq4(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                    float* y) noexcept {
  static_assert(T == ggml_type::iq4_nl || T == ggml_type::iq4_xs);
  int8_rows256<M> r(a, i0);
  const __m256i table = _mm256_broadcastsi128_si256(kvalues16());
  const auto values = [&](const unsigned char* q16) {
    return _mm256_shuffle_epi8(table, nibbles256(q16));
  };
  for_iq4_blocks(T, p, k, [&](float s, const unsigned char* q, std::int64_t j, auto u) {
    r.signed_block(values(q), j / 32, s, u);
  });
  r.sum(y);
}

/// Q4_1.
template <int M>
void dot_q8_256_q4_1(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                     float* y) noexcept {
  int8_rows256<M> r(a, i0);
  float tails[M][8] = {};  // the mins times the blocks' sums (int8_tail)
  two_blocks_a_step(p, k / 32, sizeof(block_q4_1),
                    [&](const unsigned char* q, std::int64_t b, auto u_acc) {
                      r.unsigned_block(nibbles256(block_at<block_q4_1>(q).qs), b, fp16(q), u_acc);
                      const float mw = fp16(block_at<block_q4_1>(q).m.b);
                      for (int i = 0; i < M; ++i)
                        tails[i][b % 8] = std::fma(mw, r.as[i][b], tails[i][b % 8]);
                    });
  r.sum(y, tails);
}

/// Q4_K and Q5_K.
template <ggml_type T, int M>
void dot_q8_256_q4_k_q5_k(const unsigned char* p, std::int64_t k, const int8_rows& a,
                          std::int64_t i0, float* y) noexcept {
  static_assert(T == ggml_type::q4_k || T == ggml_type::q5_k);
  int8_rows256<M> r(a, i0);
  float tails[M][8] = {};  // the mins times the blocks' sums (int8_tail)
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // Q5_K: Q4_K's scales and nibbles after 32 bytes of fifth bits (bit j of byte l: value
  // l's of sub-block j), each value its nibble + 16 where that bit is set
  constexpr bool q5 = T == ggml_type::q5_k;
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += q5 ? sizeof(block_q5_k) : sizeof(block_q4_k)) {
    float dsc[8], dmn[8];
    q4k_int8_scales(p, fp16(block_at<block_q4_k>(p).d.b), fp16(block_at<block_q4_k>(p).dmin.b), dsc,
                    dmn);
    // at step c, bit 0 of each byte its bit 2c (16-bit shifts keep a byte's own bits there)
    __m256i fifth =
        q5 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_at<block_q5_k>(p).qh))
           : _mm256_setzero_si256();
    for (std::ptrdiff_t c = 0; c < 4; ++c) {  // 32 bytes: sub-block 2c's low nibbles, 2c + 1's high
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          (q5 ? block_at<block_q5_k>(p).qs : block_at<block_q4_k>(p).qs) + 32 * c));
      __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      if (q5) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(fifth, 4), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(fifth, 3), bit4));
        fifth = _mm256_srli_epi16(fifth, 2);
      }
      const std::int64_t b = sb * 8 + 2 * c;
      r.unsigned_block(lo, b, dsc[2 * c], even{});
      r.unsigned_block(hi, b + 1, dsc[2 * c + 1], odd{});
    }
    r.q4k_mins(sb, dmn, tails);
  }
  r.sum(y, tails);
}

/// Q3_K.
template <int M>
void dot_q8_256_q3_k(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                     float* y) noexcept {
  int8_rows256<M> r(a, i0);
  // 16-value groups (q3k_group_scales); at 128-value half n and j = 0 .. 3 the 32 values
  // w + 4 of activation block 4 n + j: 2 bits of q[32 n + l] at 2 j, bit 4 n + j of hm[l]
  const __m256i three = _mm256_set1_epi8(3), one_bit = _mm256_set1_epi8(1),
                four = _mm256_set1_epi8(4);
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += sizeof(block_q3_k)) {
    float dl[16];
    detail::group_scales_q3_k(block_at<block_q3_k>(p), dl);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    for (std::ptrdiff_t n = 0; n < 2; ++n) {
      const __m256i q =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_at<block_q3_k>(p).qs + 32 * n));
      const auto block = [&](std::ptrdiff_t j, auto u_acc) {
        const __m256i low = _mm256_and_si256(
            _mm256_srl_epi16(q, _mm_cvtsi32_si128(static_cast<int>(2 * j))), three);
        const __m256i high = _mm256_and_si256(
            _mm256_srl_epi16(hm, _mm_cvtsi32_si128(static_cast<int>(4 * n + j))), one_bit);
        r.grouped_block(_mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 2)), four),
                        sb * 8 + 4 * n + j, dl[8 * n + 2 * j], dl[8 * n + 2 * j + 1], u_acc);
      };
      block(0, even{});
      block(1, odd{});
      block(2, even{});
      block(3, odd{});
    }
  }
  r.sum(y);
}

/// Q6_K.
template <int M>
void dot_q8_256_q6_k(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
                     float* y) noexcept {
  int8_rows256<M> r(a, i0);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i three0 = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
  for (std::int64_t sb = 0; sb < k / 256; ++sb, p += sizeof(block_q6_k)) {
    const float d = fp16(block_at<block_q6_k>(p).d.b);
    const auto* scales = reinterpret_cast<const std::int8_t*>(block_at<block_q6_k>(p).scales);
    for (std::ptrdiff_t half = 0; half < 2; ++half) {
      const auto* ql = reinterpret_cast<const __m256i*>(block_at<block_q6_k>(p).ql + 64 * half);
      const __m256i lo = _mm256_loadu_si256(ql), hi = _mm256_loadu_si256(ql + 1);
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(block_at<block_q6_k>(p).qh + 32 * half));
      const __m256i q6[4] = {_mm256_or_si256(_mm256_and_si256(lo, low4),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 4), three0)),
                             _mm256_or_si256(_mm256_and_si256(hi, low4),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 2), three0)),
                             _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), low4),
                                             _mm256_and_si256(h, three0)),
                             _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(hi, 4), low4),
                                             _mm256_and_si256(_mm256_srli_epi16(h, 2), three0))};
      const std::int8_t* sc = scales + 8 * half;
      const auto quarter = [&](std::ptrdiff_t qr, auto u_acc) {  // values [32 qr, 32 qr + 32)
        r.grouped_block(_mm256_sub_epi8(q6[qr], bias), sb * 8 + half * 4 + qr,
                        d * static_cast<float>(sc[2 * qr]), d * static_cast<float>(sc[2 * qr + 1]),
                        u_acc);
      };
      quarter(0, even{});
      quarter(1, odd{});
      quarter(2, even{});
      quarter(3, odd{});
    }
  }
  r.sum(y);
}
#endif

#if PREPACK_GGML_INT8
/// The vector int8 dot of T (has_dot_q8<T>): y[i] = row . a_i for the M activation rows
/// a.q + i0 (int8_rows) and one row of T, k a whole number of its blocks. The one place that
/// says which kernel computes which type: the 512-bit ones where the build has them
/// (PREPACK_GGML_INT8_512), the 256-bit ones elsewhere. O(M k).
template <ggml_type T, int M>
void dot_q8(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
            float* y) noexcept {
  static_assert(has_dot_q8<T>, "dot_q8: a type this build has a vector kernel for");
  using t = ggml_type;
#if PREPACK_GGML_INT8_512
  if constexpr (T == t::q8_0) {
    dot_q8_512_q8_0<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q4_0) {
    dot_q8_512_q4_0<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q4_1) {
    dot_q8_512_q4_1<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q5_0 || T == t::q5_1) {
    dot_q8_512_q5_0_q5_1<T, M>(p, k, a, i0, y);
  } else if constexpr (T == t::iq4_nl) {
    dot_q8_512_iq4_nl<M>(p, k, a, i0, y);
  } else if constexpr (T == t::iq4_xs) {
    dot_q8_512_iq4_xs<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q4_k || T == t::q5_k) {
    dot_q8_512_q4_k_q5_k<T, M>(p, k, a, i0, y);
  } else if constexpr (T == t::q3_k) {
    dot_q8_512_q3_k<M>(p, k, a, i0, y);
  } else {
    static_assert(T == t::q6_k);
    dot_q8_512_q6_k<M>(p, k, a, i0, y);
  }
#else
  if constexpr (T == t::q8_0) {
    dot_q8_256_q8_0<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q4_0) {
    dot_q8_256_q4_0<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q4_1) {
    dot_q8_256_q4_1<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q5_0) {
    dot_q8_256_q5_0<M>(p, k, a, i0, y);
  } else if constexpr (T == t::q5_1) {
    dot_q8_256_q5_1<M>(p, k, a, i0, y);
  } else if constexpr (T == t::iq4_nl || T == t::iq4_xs) {
    dot_q8_256_iq4<T, M>(p, k, a, i0, y);
  } else if constexpr (T == t::q4_k || T == t::q5_k) {
    dot_q8_256_q4_k_q5_k<T, M>(p, k, a, i0, y);
  } else if constexpr (T == t::q3_k) {
    dot_q8_256_q3_k<M>(p, k, a, i0, y);
  } else {
    static_assert(T == t::q6_k);
    dot_q8_256_q6_k<M>(p, k, a, i0, y);
  }
#endif
}
#endif

}  // namespace x86
}  // namespace ggml
PREPACK_NAMESPACE_END
