// prepack/ggml/arch/x86/panel.hpp - 8-bit activations at many rows (AVX512-VNNI): weight rows
// converted once into the form the int8 dots take them in, then 4 activation rows by 4 weight
// rows in registers, the result equal to dot_q8's to the bit. Standard library and
// <immintrin.h> only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "decode.hpp"
#include "simd.hpp"

PREPACK_NAMESPACE_BEGIN
namespace ggml {
namespace x86 {

// ---- 8-bit activations at many rows (AVX512-VNNI): weight rows converted once ----
//
// dot_q8 decodes a weight row's blocks again for every few activation rows. From
// linear::int8_panel_rows activation rows on, a thread converts its 16 weight rows once into
// the form every dot above takes them in (int8_weight_rows), the activations are laid out 4 rows
// at a time (int8_rows::pack_tile), and int8_tile_dot multiplies 4 activation rows by 4 weight
// rows in registers. The integers are the same (exact), and so are each lane's scale, each
// lane's sequence of fused multiply-adds and the sums at the end (the min terms in dot_q8's 8
// chains): the result equals dot_q8's to the bit, whatever the number of rows.

/// Weight rows as the integer dots take them, 4 rows interleaved a pair of 32-value blocks at a
/// time: for each row, 64 bytes of values v + 128 (unsigned bytes for vpdpbusd; v the value's
/// integer, Q4_1's / Q4_K's unsigned nibbles as they are) and the 16 lanes' scales (a four-value
/// lane's block scale, or for Q6_K and Q3_K its 16-value group's, each product of the format's
/// factors rounded once as dot_q8 forms it); a single last block padded with v = 0, scale 0.
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

#if PREPACK_GGML_INT8_PANEL
  /// Row r from one row of `type` at p (a type ggml::kernels says converts: int8_panel; cols
  /// values): the vector decoder's walk
  /// (for_int8_values), its values and scales stored instead of widened.
  /// O(cols).
  void convert_row(std::int64_t r, ggml_type type, const unsigned char* p) noexcept {
    unsigned char* base = const_cast<unsigned char*>(group(r / 4)) + (r % 4) * 128;
    float* mn = min.data() + r * (cols / 32);
    const std::int64_t nb = cols / 32;
    if (nb % 2 == 1) {  // the last pair's second block: zeros
      std::memset(base + (nb / 2) * 512 + 32, 128, 32);
      std::memset(base + (nb / 2) * 512 + 96, 0, 32);
    }
    bool mins = false;
    std::int64_t b = 0;
    const auto elements = static_cast<std::int64_t>(traits(type).block_values);
    for (std::int64_t e = 0; e < cols; e += elements, p += traits(type).block_bytes) {
      for_int8_values(type, p, [&](auto with_min, __m256i v, float d0, float d1, float m) {
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

#if PREPACK_GGML_INT8_PANEL
// y[i][r] = the lanes' sums of 4 activation rows (a tile at x, int8_rows::pack_tile) by 4
// weight rows (a group at w, int8_weight_rows), `pairs` pairs of blocks, the last a single
// block where `odd` (its lanes 8-15 untouched, as dot_q8 leaves them). Each lane's dot starts
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
  // sums as[i], null past the rows) in dot_q8's 8 chains by block b mod 8, each added by
  // int8_tail's tree (int8_sum's order); + 0 where there are none, as dot_q8's empty chains.
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

}  // namespace x86
}  // namespace ggml
PREPACK_NAMESPACE_END
