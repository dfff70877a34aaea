// prepack/reference/matrix.hpp - the reference model's matrix and vector types: Eigen, row-major,
// so a token's features (a row of activations, an output feature's weights) are contiguous.
#pragma once

#include <Eigen/Core>

#include "../config.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Activations [tokens][features] and weights [in][out]: row-major fp32.
using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Norm weights, biases: fp32.
using vector = Eigen::VectorXf;

}  // namespace reference
PREPACK_NAMESPACE_END
