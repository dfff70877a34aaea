// prepack/checkpoint/quant.hpp - ggml's tensor types as the checkpoint readers name them: the
// type enum, names, block sizes and decoding of the ggml component (include/prepack/ggml/: its
// traits table, block structs and kernels) under prepack::checkpoint, where GGUF's readers and
// the loader use them. Standard library only. Cost: O(1) a lookup; decoding O(values).
#pragma once

#include <cstdint>
#include <optional>

#include "../ggml/kernels.hpp"
#include "../ggml/types.hpp"

PREPACK_NAMESPACE_BEGIN
namespace checkpoint {

using ggml::dequantize;
using ggml::dequantize_fast;
using ggml::ggml_type;
using ggml::ggml_type_name;

/// A type's block: `elements` values stored in `bytes` bytes (1 and the element size for the
/// plain float types).
struct ggml_block {
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
};

/// The block of a type prepack dequantizes (ggml::traits(t).decodes), or nothing for one it
/// does not (its name, if ggml has one, says what it is). O(1).
inline std::optional<ggml_block> dequantizable_block(ggml_type t) noexcept {
  const ggml::type_traits& tr = ggml::traits(t);
  if (!tr.decodes) return std::nullopt;
  return ggml_block{tr.block_values, tr.block_bytes};
}

}  // namespace checkpoint
PREPACK_NAMESPACE_END
