// prepack/ggml/kernels.hpp - each type's CPU kernels in one table (ggml's type_traits_cpu): its
// blocks decoded exactly and fast, its fp32 dot straight from the blocks at 1 to 4 activation
// rows, and its int8 dot (8-bit activations) where it has an int8 form. Each entry is the
// type's vector kernel where this build has one (ggml/arch/x86/) and its generic one
// (ggml/quants.hpp) otherwise, so every entry computes on every CPU; the *_vector flags say
// which one it is (a caller chooses to dot straight from the blocks only where that is faster
// than decoding a panel for a GEMM). Then the rows API: dequantize, dequantize_fast. Standard
// library (and <immintrin.h> on x86) only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../error.hpp"
#include "arch/x86/decode.hpp"
#include "arch/x86/dot_f32.hpp"
#include "arch/x86/dot_q8.hpp"
#include "quants.hpp"
#include "types.hpp"

PREPACK_NAMESPACE_BEGIN
namespace ggml {

/// `blocks` whole blocks at src into out (their values).
using decode_fn = void (*)(const unsigned char* src, std::size_t blocks, float* out) noexcept;
/// y[i] = a_i . row for M activation rows a[M][k] (lda); k a whole number of blocks.
using dot_f32_fn = void (*)(const unsigned char* row, std::int64_t k, const float* a,
                            std::int64_t lda, float* y) noexcept;
/// y[i] = row . a_i for the M rows a.q + i0 of 8-bit activations; k a whole number of blocks.
using dot_q8_fn = void (*)(const unsigned char* row, std::int64_t k, const int8_rows& a,
                           std::int64_t i0, float* y) noexcept;

/// One type's kernels (all null for a type prepack does not decode).
struct cpu_kernels {
  decode_fn decode_exact = nullptr;  // ggml's values bit for bit
  decode_fn decode = nullptr;        // products free to fuse: within one fp32 rounding
  dot_f32_fn dot_f32[4] = {};        // [M - 1], M = 1 .. 4 activation rows
  bool dot_f32_vector = false;       // dot_f32 is a vector kernel on this build
  dot_q8_fn dot_q8[4] = {};          // [M - 1]; null where the type has no int8 form
  bool dot_q8_vector = false;        // dot_q8 is a vector kernel on this build
  bool int8_panel = false;           // rows convert to x86's int8 weight panels on this build
};

namespace detail {

template <ggml_type T>
void decode_fast(const unsigned char* src, std::size_t blocks, float* out) noexcept {
#if PREPACK_GGML_AVX2
  x86::decode_blocks<T>(src, blocks, out);
#else
  decode_blocks_generic<T, false>(src, blocks, out);
#endif
}

template <ggml_type T, int M>
void dot_f32(const unsigned char* p, std::int64_t k, const float* a, std::int64_t lda,
             float* y) noexcept {
#if PREPACK_GGML_FUSED
  if constexpr (x86::has_dot_f32<T>) {
    x86::dot_f32<T, M>(p, k, a, lda, y);
  } else
#endif
  {
    dot_f32_generic<T, M>(p, k, a, lda, y);
  }
}

template <ggml_type T, int M>
void dot_q8(const unsigned char* p, std::int64_t k, const int8_rows& a, std::int64_t i0,
            float* y) noexcept {
#if PREPACK_GGML_INT8
  if constexpr (x86::has_dot_q8<T>) {
    x86::dot_q8<T, M>(p, k, a, i0, y);
  } else
#endif
  {
    dot_q8_generic<T, M>(p, k, a, i0, y);
  }
}

template <ggml_type T>
constexpr cpu_kernels kernels_of() noexcept {
  cpu_kernels c;
  c.decode_exact = &decode_blocks_generic<T, true>;
  c.decode = &decode_fast<T>;
  c.dot_f32[0] = &dot_f32<T, 1>;
  c.dot_f32[1] = &dot_f32<T, 2>;
  c.dot_f32[2] = &dot_f32<T, 3>;
  c.dot_f32[3] = &dot_f32<T, 4>;
  c.dot_f32_vector = x86::has_dot_f32<T>;
  if constexpr (traits(T).int8_dot) {
    c.dot_q8[0] = &dot_q8<T, 1>;
    c.dot_q8[1] = &dot_q8<T, 2>;
    c.dot_q8[2] = &dot_q8<T, 3>;
    c.dot_q8[3] = &dot_q8<T, 4>;
    c.dot_q8_vector = x86::has_dot_q8<T>;
    c.int8_panel = PREPACK_GGML_INT8_PANEL && x86::has_int8_values<T>;
  }
  return c;
}

}  // namespace detail

/// The kernel table, by type number; a row for every type traits() says prepack decodes (the
/// header's test checks the two agree).
inline constexpr cpu_kernels kernel_table[type_count] = {
    detail::kernels_of<ggml_type::f32>(),     // 0
    detail::kernels_of<ggml_type::f16>(),     // 1
    detail::kernels_of<ggml_type::q4_0>(),    // 2
    detail::kernels_of<ggml_type::q4_1>(),    // 3
    {},                                       // 4
    {},                                       // 5
    detail::kernels_of<ggml_type::q5_0>(),    // 6
    detail::kernels_of<ggml_type::q5_1>(),    // 7
    detail::kernels_of<ggml_type::q8_0>(),    // 8
    {},                                       // 9 Q8_1
    detail::kernels_of<ggml_type::q2_k>(),    // 10
    detail::kernels_of<ggml_type::q3_k>(),    // 11
    detail::kernels_of<ggml_type::q4_k>(),    // 12
    detail::kernels_of<ggml_type::q5_k>(),    // 13
    detail::kernels_of<ggml_type::q6_k>(),    // 14
    {},                                       // 15 Q8_K
    {},                                       // 16 IQ2_XXS
    {},                                       // 17 IQ2_XS
    {},                                       // 18 IQ3_XXS
    {},                                       // 19 IQ1_S
    detail::kernels_of<ggml_type::iq4_nl>(),  // 20
    {},                                       // 21 IQ3_S
    {},                                       // 22 IQ2_S
    detail::kernels_of<ggml_type::iq4_xs>(),  // 23
    {},                                       // 24 I8
    {},                                       // 25 I16
    {},                                       // 26 I32
    {},                                       // 27 I64
    {},                                       // 28 F64
    {},                                       // 29 IQ1_M
    detail::kernels_of<ggml_type::bf16>(),    // 30
    {},                                       // 31
    {},                                       // 32
    {},                                       // 33
    {},                                       // 34 TQ1_0
    {},                                       // 35 TQ2_0
    {},                                       // 36
    {},                                       // 37
    {},                                       // 38
    {},                                       // 39 MXFP4
};

inline constexpr cpu_kernels no_kernels{};

/// The kernels of t (all null for a type prepack does not decode). O(1).
constexpr const cpu_kernels& kernels(ggml_type t) noexcept {
  const auto n = static_cast<std::uint32_t>(t);
  return n < type_count ? kernel_table[n] : no_kernels;
}

namespace detail {
inline void require_decodes(ggml_type type, std::size_t n) {
  const type_traits& t = traits(type);
  if (!t.decodes) {
    prepack::detail::fail("ggml type ", t.name != nullptr ? t.name : "",
                          t.name != nullptr ? " (" : "", static_cast<std::uint32_t>(type),
                          t.name != nullptr ? ")" : "", " cannot be dequantized");
  }
  prepack::detail::require(n % t.block_values == 0, "ggml type ", t.name, ": ", n,
                           " values are not a whole number of ", t.block_values, "-value blocks");
}
}  // namespace detail

/// Dequantizes n values of `type` stored at `src` (n / block values whole blocks) into
/// out[0, n), exactly as ggml defines each block (equal to gguf-py's gguf.quants.dequantize
/// bit for bit). Throws prepack::error, writing nothing, for a type prepack does not decode or
/// an n that is not a whole number of blocks. Cost: O(n), no allocation.
inline void dequantize(ggml_type type, const unsigned char* src, std::size_t n, float* out) {
  detail::require_decodes(type, n);
  kernels(type).decode_exact(src, n / traits(type).block_values, out);
}

/// dequantize's values with the products free to fuse with the additions that follow (one
/// rounding where dequantize rounds twice: within one fp32 rounding of it, and vectorised), for
/// weights decoded inside a GEMM. n a whole number of blocks of a type prepack decodes: checked
/// by the caller (reference::quantized_matrix checks both when it is made); anything else
/// writes nothing. Cost: n values, no allocation, no throw.
inline void dequantize_fast(ggml_type type, const unsigned char* src, std::size_t n,
                            float* out) noexcept {
  const type_traits& t = traits(type);
  if (!t.decodes) return;
  kernels(type).decode(src, n / t.block_values, out);
}

}  // namespace ggml
PREPACK_NAMESPACE_END
