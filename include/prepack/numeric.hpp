// prepack/numeric.hpp - 16-bit floating-point storage types for KV caches and weights:
// prepack::half (IEEE 754 binary16, fp16) and prepack::bfloat16 (bf16). Storage only: they
// convert to and from float and double, rounding to nearest even as engines' cache kernels do
// when they write fp32 results into a half-precision cache; a double is rounded once, from its
// own value (never through float, which would round twice). Standard library only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "config.hpp"

PREPACK_NAMESPACE_BEGIN

namespace detail {
inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// d rounded to float toward zero, its last bit set when that was inexact ("round to odd").
// Rounding the result to nearest even into a format of at most 22 significant bits (half: 11,
// bfloat16: 8) gives what rounding d itself would: one rounding, not two.
inline float round_to_odd(double d) noexcept {
  if (std::isnan(d) || std::isinf(d)) return static_cast<float>(d);
  float f = static_cast<float>(d);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  if (static_cast<double>(f) != d) f = bits_float(float_bits(f) | 1u);
  return f;
}
}  // namespace detail

/// IEEE 754 binary16. Conversion from float rounds to nearest even; overflow gives infinity,
/// NaN stays NaN, tiny values become subnormals or zero.
struct half {
  std::uint16_t bits = 0;

  half() = default;
  explicit half(float f) noexcept : bits(from_float(f)) {}
  explicit half(double d) noexcept : bits(from_double(d)) {}
  explicit operator float() const noexcept { return to_float(bits); }

  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t u = detail::float_bits(f);
    const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) {  // inf or NaN (quiet, keeping a payload bit)
      return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds past 65504
    if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
      if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25)
      const std::uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
      const int shift = 126 - static_cast<int>(abs >> 23);  // 14 - (exponent - 127) + 23 - 10
      const std::uint32_t q = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
      const std::uint32_t r = q + ((rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u);
      return static_cast<std::uint16_t>(sign | r);
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
    const std::uint32_t rebased = abs - 0x38000000u;  // exponent - (127 - 15)
    const std::uint32_t q = rebased >> 13, rem = rebased & 0x1FFFu;
    const std::uint32_t r = q + ((rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | r);
  }

  /// d rounded once to the nearest half (ties to even).
  static std::uint16_t from_double(double d) noexcept {
    return from_float(detail::round_to_odd(d));
  }

  static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0x1Fu) return detail::bits_float(sign | 0x7F800000u | (mant << 13));
    if (exp != 0) return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return detail::bits_float(sign);
    // Subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign != 0 ? -v : v;
  }
};

/// bfloat16: the upper half of a float. Conversion rounds to nearest even; NaN stays NaN.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  explicit bfloat16(double d) noexcept : bits(from_double(d)) {}
  explicit operator float() const noexcept { return to_float(bits); }

  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t u = detail::float_bits(f);
    const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t nan = (u >> 16) | 0x40u;  // a quiet NaN, sign and payload kept
    // Branch-free (vectorisable): NaN when the exponent is all ones and the mantissa is not 0.
    return static_cast<std::uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
  }
  /// d rounded once to the nearest bfloat16 (ties to even).
  static std::uint16_t from_double(double d) noexcept {
    return from_float(detail::round_to_odd(d));
  }
  static float to_float(std::uint16_t b) noexcept {
    return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
  }
};

/// The most negative finite value of an element type (float, double, half, bfloat16): what a
/// softmax mask adds to block a key without an infinity (torch.finfo(dtype).min).
template <class T>
T lowest_finite() noexcept {
  if constexpr (std::is_same_v<T, half>) {
    half h;
    h.bits = 0xFBFFu;  // -65504
    return h;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    bfloat16 b;
    b.bits = 0xFF7Fu;  // -3.3895e38 (rounding float's lowest would give -inf)
    return b;
  } else {
    return std::numeric_limits<T>::lowest();
  }
}

/// Converts a float to a destination element type: float, double, half or bfloat16.
template <class T>
T convert_to(float f) noexcept {
  return static_cast<T>(f);
}

/// Converts any supported element type (float, double, half, bfloat16) to float.
template <class T>
float to_float(T v) noexcept {
  return static_cast<float>(v);
}

/// Converts between the supported element types (float, double, half, bfloat16), rounding once
/// to nearest even where the destination is narrower: a double goes into half or bfloat16
/// straight from its own value.
template <class D, class S>
D convert(S v) noexcept {
  constexpr bool to_16 = std::is_same_v<D, half> || std::is_same_v<D, bfloat16>;
  if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>) {
    return convert<D>(static_cast<float>(v));  // exact
  } else if constexpr (to_16 && std::is_floating_point_v<S> && sizeof(S) > sizeof(float)) {
    return D(static_cast<double>(v));  // rounded once, from the double
  } else if constexpr (to_16) {
    return D(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

PREPACK_NAMESPACE_END
