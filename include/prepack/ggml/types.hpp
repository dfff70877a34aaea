// prepack/ggml/types.hpp - ggml's tensor types as GGUF files number them, the layout of the
// blocks prepack decodes (ggml-common.h's block_* structs, byte for byte, each size checked at
// compile time), and the one table of each type's traits every "which types" decision reads:
// its name, its block's values and bytes, whether prepack decodes it, and which kernels it has
// (ggml/kernels.hpp holds the kernels themselves). Standard library only. Cost: O(1) a lookup.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../config.hpp"
#include "../numeric.hpp"

PREPACK_NAMESPACE_BEGIN
namespace ggml {

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

/// One past the largest type number the table knows.
inline constexpr std::uint32_t type_count = 40;

// ---- The blocks (ggml-common.h). Every field is bytes: the structs have alignment 1, so a
// block may be read at any address of a file or buffer, and a field's position is its offset,
// never a literal. fp16 scales are stored little-endian (fp16_bits). ----

/// An fp16 value as stored: two bytes, little-endian.
struct fp16_bits {
  unsigned char b[2];
  std::uint16_t bits() const noexcept { return static_cast<std::uint16_t>(b[0] | (b[1] << 8)); }
  float value() const noexcept { return half::to_float(bits()); }
};

inline constexpr int qk4_0 = 32, qk4_1 = 32, qk5_0 = 32, qk5_1 = 32, qk8_0 = 32, qk4_nl = 32;
inline constexpr int qk_k = 256;  // the K-quants' and IQ4_XS's super-block

struct block_q4_0 {  // (q - 8) d; value j < 16 byte j's low nibble, j >= 16 byte j - 16's high
  fp16_bits d;
  unsigned char qs[qk4_0 / 2];
};
struct block_q4_1 {  // q d + m
  fp16_bits d, m;
  unsigned char qs[qk4_1 / 2];
};
struct block_q5_0 {  // (q - 16) d; q's fifth bit j in bit j of the 32-bit little-endian qh
  fp16_bits d;
  unsigned char qh[4];
  unsigned char qs[qk5_0 / 2];
};
struct block_q5_1 {  // q d + m
  fp16_bits d, m;
  unsigned char qh[4];
  unsigned char qs[qk5_1 / 2];
};
struct block_q8_0 {  // q d, q signed bytes
  fp16_bits d;
  unsigned char qs[qk8_0];
};
struct block_q2_k {  // 16 groups of 16: scales' low nibble scales d, high nibble mins dmin
  unsigned char scales[qk_k / 16];
  unsigned char qs[qk_k / 4];
  fp16_bits d, dmin;
};
struct block_q3_k {  // 16 groups of 16: 2 bits in qs, a high bit in hmask, 6-bit scales
  unsigned char hmask[qk_k / 8];
  unsigned char qs[qk_k / 4];
  unsigned char scales[12];
  fp16_bits d;
};
struct block_q4_k {  // 8 sub-blocks of 32: 6-bit scales and mins packed in 12 bytes
  fp16_bits d, dmin;
  unsigned char scales[12];
  unsigned char qs[qk_k / 2];
};
struct block_q5_k {  // Q4_K with a fifth bit per value in qh
  fp16_bits d, dmin;
  unsigned char scales[12];
  unsigned char qh[qk_k / 8];
  unsigned char qs[qk_k / 2];
};
struct block_q6_k {  // 16 groups of 16: low nibbles in ql, 2 high bits in qh, int8 scales
  unsigned char ql[qk_k / 2];
  unsigned char qh[qk_k / 4];
  unsigned char scales[qk_k / 16];
  fp16_bits d;
};
struct block_iq4_nl {  // d kvalues_iq4nl[q], 4-bit indices as Q4_0's nibbles
  fp16_bits d;
  unsigned char qs[qk4_nl / 2];
};
struct block_iq4_xs {  // 8 sub-blocks of 32, each d (ls - 32) kvalues_iq4nl[q]
  fp16_bits d;
  unsigned char scales_h[2];  // little-endian 16 bits: 2 high bits of each ls
  unsigned char scales_l[qk_k / 64];
  unsigned char qs[qk_k / 2];
};

static_assert(sizeof(fp16_bits) == 2 && alignof(fp16_bits) == 1, "fp16_bits: 2 bytes");
static_assert(sizeof(block_q4_0) == 2 + 16, "block_q4_0: ggml's 18 bytes");
static_assert(sizeof(block_q4_1) == 2 + 2 + 16, "block_q4_1: ggml's 20 bytes");
static_assert(sizeof(block_q5_0) == 2 + 4 + 16, "block_q5_0: ggml's 22 bytes");
static_assert(sizeof(block_q5_1) == 2 + 2 + 4 + 16, "block_q5_1: ggml's 24 bytes");
static_assert(sizeof(block_q8_0) == 2 + 32, "block_q8_0: ggml's 34 bytes");
static_assert(sizeof(block_q2_k) == 16 + 64 + 2 + 2, "block_q2_K: ggml's 84 bytes");
static_assert(sizeof(block_q3_k) == 32 + 64 + 12 + 2, "block_q3_K: ggml's 110 bytes");
static_assert(sizeof(block_q4_k) == 2 + 2 + 12 + 128, "block_q4_K: ggml's 144 bytes");
static_assert(sizeof(block_q5_k) == 2 + 2 + 12 + 32 + 128, "block_q5_K: ggml's 176 bytes");
static_assert(sizeof(block_q6_k) == 128 + 64 + 16 + 2, "block_q6_K: ggml's 210 bytes");
static_assert(sizeof(block_iq4_nl) == 2 + 16, "block_iq4_nl: ggml's 18 bytes");
static_assert(sizeof(block_iq4_xs) == 2 + 2 + 4 + 128, "block_iq4_xs: ggml's 136 bytes");
static_assert(alignof(block_q4_k) == 1 && alignof(block_q6_k) == 1 && alignof(block_iq4_xs) == 1,
              "blocks are read at any address");

/// The block at p, read in place (the structs are bytes: any address is aligned).
template <class Block>
inline const Block& block_at(const unsigned char* p) noexcept {
  return *reinterpret_cast<const Block*>(p);
}

// ---- The traits table ----

/// What prepack knows of one type. A type prepack does not decode has its name (where ggml
/// defines one) and nothing else.
struct type_traits {
  const char* name = nullptr;      // ggml's name ("Q4_K"), nullptr for a number it leaves free
  std::uint32_t block_values = 0;  // values a block holds (1 for the plain float types)
  std::uint32_t block_bytes = 0;   // bytes a block takes (the element size for those)
  bool decodes = false;            // prepack decodes it to fp32 (block_* above, ggml/quants.hpp)
  bool quantized = false;          // block-quantized: held as stored when a model asks to
  bool int8_dot = false;           // dots with 8-bit activations (ggml/quants.hpp, int8_form)
};

namespace detail {
constexpr type_traits named(const char* name) noexcept { return {name, 0, 0, false, false, false}; }
constexpr type_traits plain(const char* name, std::uint32_t bytes) noexcept {
  return {name, 1, bytes, true, false, false};
}
template <class Block>
constexpr type_traits blocks(const char* name, std::uint32_t values, bool int8) noexcept {
  return {name, values, static_cast<std::uint32_t>(sizeof(Block)), true, true, int8};
}
}  // namespace detail

/// The table, by type number (ggml's type_traits). Adding a type: its row here, its block
/// struct above, its kernels in ggml/quants.hpp (and ggml/arch/ where it has vector ones); see
/// docs/quantized.md, "Adding a type".
inline constexpr type_traits type_table[type_count] = {
    detail::plain("F32", 4),                               // 0
    detail::plain("F16", 2),                               // 1
    detail::blocks<block_q4_0>("Q4_0", qk4_0, true),       // 2
    detail::blocks<block_q4_1>("Q4_1", qk4_1, true),       // 3
    {},                                                    // 4 (Q4_2, removed)
    {},                                                    // 5 (Q4_3, removed)
    detail::blocks<block_q5_0>("Q5_0", qk5_0, true),       // 6
    detail::blocks<block_q5_1>("Q5_1", qk5_1, true),       // 7
    detail::blocks<block_q8_0>("Q8_0", qk8_0, true),       // 8
    detail::named("Q8_1"),                                 // 9
    detail::blocks<block_q2_k>("Q2_K", qk_k, false),       // 10
    detail::blocks<block_q3_k>("Q3_K", qk_k, true),        // 11
    detail::blocks<block_q4_k>("Q4_K", qk_k, true),        // 12
    detail::blocks<block_q5_k>("Q5_K", qk_k, true),        // 13
    detail::blocks<block_q6_k>("Q6_K", qk_k, true),        // 14
    detail::named("Q8_K"),                                 // 15
    detail::named("IQ2_XXS"),                              // 16
    detail::named("IQ2_XS"),                               // 17
    detail::named("IQ3_XXS"),                              // 18
    detail::named("IQ1_S"),                                // 19
    detail::blocks<block_iq4_nl>("IQ4_NL", qk4_nl, true),  // 20
    detail::named("IQ3_S"),                                // 21
    detail::named("IQ2_S"),                                // 22
    detail::blocks<block_iq4_xs>("IQ4_XS", qk_k, true),    // 23
    detail::named("I8"),                                   // 24
    detail::named("I16"),                                  // 25
    detail::named("I32"),                                  // 26
    detail::named("I64"),                                  // 27
    detail::named("F64"),                                  // 28
    detail::named("IQ1_M"),                                // 29
    detail::plain("BF16", 2),                              // 30
    {},                                                    // 31 (Q4_0_4_4, removed)
    {},                                                    // 32 (Q4_0_4_8, removed)
    {},                                                    // 33 (Q4_0_8_8, removed)
    detail::named("TQ1_0"),                                // 34
    detail::named("TQ2_0"),                                // 35
    {},                                                    // 36 (IQ4_NL_4_4, removed)
    {},                                                    // 37 (IQ4_NL_4_8, removed)
    {},                                                    // 38 (IQ4_NL_8_8, removed)
    detail::named("MXFP4"),                                // 39
};

inline constexpr type_traits no_traits{};

/// The traits of t (all empty for a number past the table). O(1).
constexpr const type_traits& traits(ggml_type t) noexcept {
  const auto n = static_cast<std::uint32_t>(t);
  return n < type_count ? type_table[n] : no_traits;
}

/// ggml's name of a type ("Q4_K"), or nullptr for a number ggml does not define. O(1).
constexpr const char* ggml_type_name(ggml_type t) noexcept { return traits(t).name; }

/// The block-quantized types prepack decodes, in the table's order (a test's and a
/// benchmark's list; every other decision reads traits()).
template <class F>
void for_each_quantized(F&& f) {
  for (std::uint32_t n = 0; n < type_count; ++n) {
    if (type_table[n].quantized) f(static_cast<ggml_type>(n));
  }
}

}  // namespace ggml
PREPACK_NAMESPACE_END
