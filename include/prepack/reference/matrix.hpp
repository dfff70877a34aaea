// prepack/reference/matrix.hpp - the reference model's matrix and vector types: Eigen, row-major,
// so a token's features (a row of activations, an output feature's weights) are contiguous; and
// the element types its projection weights can be held in.
#pragma once

#include <Eigen/Core>

#include "../config.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Activations [tokens][features] and weights [in][out]: row-major fp32.
using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Norm weights, biases: fp32.
using vector = Eigen::VectorXf;

/// The element type the projection weights are held in: fp32, or bf16 (weights rounded to
/// bf16 once; the activations they multiply are rounded to bf16 too and the products are
/// accumulated in fp32, as AVX512-BF16 computes them).
enum class weight_type { f32, bf16 };

inline const char* weight_type_name(weight_type t) {
  return t == weight_type::bf16 ? "bf16" : "f32";
}

}  // namespace reference
PREPACK_NAMESPACE_END
