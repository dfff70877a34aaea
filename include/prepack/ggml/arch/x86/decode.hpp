// prepack/ggml/arch/x86/decode.hpp - blocks decoded in vectors (AVX2, AVX-512): each block's
// values made as 32 signed bytes at a time with their scales (for_int8_values: the walk the
// decoder and the int8 weight panels share), then widened, scaled and offset. Standard library
// and <immintrin.h> only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "simd.hpp"

PREPACK_NAMESPACE_BEGIN
namespace ggml {
namespace x86 {

#if PREPACK_GGML_AVX2
// decode_blocks_generic<T, false> in vectors, for every block type but Q2_K (IQ4's indices looked
// up 32 at a time by a byte shuffle): the compiler vectorises the loops above poorly or not at all
// on some (a core, ns a value, AVX-512 / AVX2 builds: Q4_0 0.07 / 0.43 -> 0.04 / 0.06, Q4_1 0.09 /
// 0.51 -> 0.04 / 0.06, Q3_K 0.16 / 0.55 -> 0.05 / 0.08, Q6_K 0.20 / 0.18 -> 0.05 / 0.06). A block's
// values are made as 32 signed bytes at a time, then widened (16 at a time on AVX-512, 8 on AVX2),
// scaled and offset (one FMA where the loops' product and sum may fuse too: the same bound).

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
      const auto& b = block_at<block_q4_0>(p);
      const float d = fp16(b.d.b);
      block(no, _mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)), d, d, 0.0f);
      return true;
    }
    case ggml_type::q4_1: {
      const auto& b = block_at<block_q4_1>(p);
      const float d = fp16(b.d.b), m = fp16(b.m.b);
      block(yes, nibbles32(b.qs), d, d, m);
      return true;
    }
    case ggml_type::q5_0: {  // the nibbles with bit j of the 32-bit qh as 16 on value j
      const auto& b = block_at<block_q5_0>(p);
      const float d = fp16(b.d.b);
      block(no, _mm256_sub_epi8(q5_values32(b.qh, b.qs), _mm256_set1_epi8(16)), d, d, 0.0f);
      return true;
    }
    case ggml_type::q5_1: {
      const auto& b = block_at<block_q5_1>(p);
      const float d = fp16(b.d.b), m = fp16(b.m.b);
      block(yes, q5_values32(b.qh, b.qs), d, d, m);
      return true;
    }
    case ggml_type::q8_0: {
      const auto& b = block_at<block_q8_0>(p);
      const float d = fp16(b.d.b);
      block(no, load32(b.qs), d, d, 0.0f);
      return true;
    }
    case ggml_type::q3_k: {
      const auto& b = block_at<block_q3_k>(p);
      float ds[16];
      detail::group_scales_q3_k(b, ds);
      const __m256i hm = load32(b.hmask), four = _mm256_set1_epi8(4);
      const unsigned char* qs = b.qs;
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
      const auto& b4 = block_at<block_q4_k>(p);  // Q5_K's d, dmin, scales are Q4_K's
      const auto& b5 = block_at<block_q5_k>(p);
      static_assert(offsetof(block_q5_k, scales) == offsetof(block_q4_k, scales), "Q5_K");
      const float d = fp16(b4.d.b), dmin = fp16(b4.dmin.b);
      const unsigned char* sc = b4.scales;
      const __m256i qh = q5 ? load32(b5.qh) : _mm256_setzero_si256();
      const __m256i sixteen = _mm256_set1_epi8(16);
      const unsigned char* qs = q5 ? b5.qs : b4.qs;
      for (int j = 0; j < 4; ++j, qs += 32) {
        const __m256i ql = load32(qs);
        for (int h = 0; h < 2; ++h) {
          unsigned s, m;
          detail::scale_min_k4(2 * j + h, sc, s, m);
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
      const auto& b = block_at<block_q6_k>(p);
      const unsigned char* sc = b.scales;
      const float d = fp16(b.d.b);
      const __m256i c32 = _mm256_set1_epi8(32);
      const unsigned char* ql = b.ql;
      const unsigned char* qh = b.qh;
      for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8) {
        const __m256i ql0 = load32(ql), ql1 = load32(ql + 32), h = load32(qh);
        const __m256i v[4] = {
            _mm256_or_si256(bits32(ql0, 0, 0x0F), _mm256_slli_epi16(bits32(h, 0, 3), 4)),
            _mm256_or_si256(bits32(ql1, 0, 0x0F), _mm256_slli_epi16(bits32(h, 2, 3), 4)),
            _mm256_or_si256(bits32(ql0, 4, 0x0F), _mm256_slli_epi16(bits32(h, 4, 3), 4)),
            _mm256_or_si256(bits32(ql1, 4, 0x0F), _mm256_slli_epi16(bits32(h, 6, 3), 4))};
        for (std::ptrdiff_t g = 0; g < 4; ++g) {
          block(no, _mm256_sub_epi8(v[g], c32), d * static_cast<float>(detail::as_int8(sc[2 * g])),
                d * static_cast<float>(detail::as_int8(sc[2 * g + 1])), 0.0f);
        }
      }
      return true;
    }
    case ggml_type::iq4_nl:
    case ggml_type::iq4_xs: {  // each 16-byte group of indices looked up as 32 values
      const __m128i table = kvalues16();
      const __m256i values = _mm256_setr_m128i(table, table);
      const auto lookup = [&](const unsigned char* q) {
        return _mm256_shuffle_epi8(values, nibbles32(q));
      };
      if (type == ggml_type::iq4_nl) {
        const auto& b = block_at<block_iq4_nl>(p);
        const float d = fp16(b.d.b);
        block(no, lookup(b.qs), d, d, 0.0f);
        return true;
      }
      const auto& b = block_at<block_iq4_xs>(p);
      const float d = fp16(b.d.b);
      for (std::ptrdiff_t ib = 0; ib < 8; ++ib) {
        const float dl = d * static_cast<float>(detail::scale_iq4_xs(b, ib));
        block(no, lookup(b.qs + 16 * ib), dl, dl, 0.0f);
      }
      return true;
    }
    default:
      return false;
  }
}

/// Blocks of T decoded in vectors where the walk above takes T (has_int8_values), else by the
/// generic decoder
/// (fast form: within one fp32 rounding of ggml's values). O(values).
template <ggml_type T>
inline void decode_blocks(const unsigned char* src, std::size_t blocks, float* y) noexcept {
  constexpr std::size_t bytes = traits(T).block_bytes;
  if constexpr (!has_int8_values<T>) {
    decode_blocks_generic<T, false>(src, blocks, y);
  } else {
    for (std::size_t k = 0; k < blocks; ++k) {
      for_int8_values(T, src + k * bytes,
                      [&y](auto has_min, __m256i v, float d0, float d1, float m) {
                        if constexpr (decltype(has_min)::value) {
                          widen32<true>(v, d0, d1, y, m);
                        } else {
                          widen32(v, d0, d1, y);
                        }
                        y += 32;
                      });
    }
  }
}
#endif

}  // namespace x86
}  // namespace ggml
PREPACK_NAMESPACE_END
