// prepack/reference/quantized.hpp - a projection's weights held as the checkpoint stores them
// (ggml's blocks: Q8_0, Q4_0, the K-quants, F16, ...), rows of output features, decoded a few
// rows at a time inside the GEMM or dotted straight from their blocks, exactly as ggml defines
// each type (the ggml component: include/prepack/ggml/), never as a whole fp32 copy. A Q4_K_M
// model so takes about the file's size instead of 4 bytes a weight.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../ggml/arch/x86/panel.hpp"
#include "../ggml/kernels.hpp"
#include "../ggml/types.hpp"
#include "matrix.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {
namespace detail {

// The 8-bit activations and the int8 weight panels (ggml/quants.hpp, ggml/arch/x86/panel.hpp).
using ggml::int8_rows;
using ggml::x86::int8_weight_rows;
#if PREPACK_GGML_INT8_PANEL
using ggml::x86::int8_tile_dot;
#endif

/// Whether rows of `type` dot with 8-bit activations (the ggml table's int8_dot).
constexpr bool int8_dot_type(ggml::ggml_type type) noexcept { return ggml::traits(type).int8_dot; }

/// Whether rows of `type` dot straight from their blocks faster than a decoded panel: where
/// this build has the type's vector fp32 dot (the ggml kernel table's dot_f32_vector).
constexpr bool fused_dot_type(ggml::ggml_type type) noexcept {
  return ggml::kernels(type).dot_f32_vector;
}

}  // namespace detail

/// `rows` output features of `cols` inputs each ([out][in], torch's order: the transpose of the
/// model's semantic [in][out] form), each row `row_bytes` bytes of ggml's blocks of `type`.
/// Empty (rows 0) where a projection is held in fp32 instead.
struct quantized_matrix {
  ggml::ggml_type type = ggml::ggml_type::f32;
  Eigen::Index rows = 0, cols = 0;
  std::size_t row_bytes = 0;
  std::vector<unsigned char> bytes;  // [rows][row_bytes]

  bool empty() const noexcept { return rows == 0; }
  const char* type_name() const noexcept { return ggml::ggml_type_name(type); }

  /// rows x cols values of `type` copied from src (n bytes, the rows one after another). Throws
  /// prepack::error naming `what` for a type prepack does not decode, a row that is not a whole
  /// number of blocks, or n other than the rows' bytes. Cost: one copy of n bytes.
  static quantized_matrix from_bytes(ggml::ggml_type type, Eigen::Index rows, Eigen::Index cols,
                                     const unsigned char* src, std::size_t n,
                                     const std::string& what) {
    using prepack::detail::require;
    const ggml::type_traits& block = ggml::traits(type);
    const char* name = block.name;
    require(block.decodes, what, ": type ", name != nullptr ? name : "?", " (",
            static_cast<std::uint32_t>(type), ") cannot be decoded");
    require(rows > 0 && cols > 0, what, ": shape ", rows, " x ", cols);
    require(static_cast<std::uint64_t>(cols) % block.block_values == 0, what, ": rows of ", cols,
            " values are not a whole number of ", name, "'s ", block.block_values, "-value blocks");
    quantized_matrix q;
    q.type = type;
    q.rows = rows;
    q.cols = cols;
    q.row_bytes = static_cast<std::size_t>(static_cast<std::uint64_t>(cols) / block.block_values *
                                           block.block_bytes);
    const std::size_t total =
        prepack::detail::mul(q.row_bytes, static_cast<std::size_t>(rows), "quantized weights");
    require(n == total, what, ": ", n, " bytes, expected ", total, " (", rows, " rows of ",
            q.row_bytes, " bytes)");
    q.bytes.assign(src, src + n);
    return q;
  }

  /// An fp32 matrix in the model's [in][out] form as rows of type F32 (a transposed copy), to
  /// fuse beside quantized rows.
  static quantized_matrix from_fp32(const matrix& in_out) {
    quantized_matrix q;
    q.type = ggml::ggml_type::f32;
    q.rows = in_out.cols();
    q.cols = in_out.rows();
    q.row_bytes = static_cast<std::size_t>(q.cols) * sizeof(float);
    q.bytes.resize(q.row_bytes * static_cast<std::size_t>(q.rows));
    const matrix t = in_out.transpose();
    std::memcpy(q.bytes.data(), t.data(), q.bytes.size());
    return q;
  }

  /// Rows [r0, r0 + n) decoded to fp32 into out[n][cols] as ggml defines the type (its
  /// products free to fuse with the additions that follow: ggml::dequantize_fast, within one
  /// fp32 rounding of ggml's reference values). Cost: n x cols values decoded; no allocation,
  /// no throw.
  void decode_rows(Eigen::Index r0, Eigen::Index n, float* out) const noexcept {
    const ggml::decode_fn decode = ggml::kernels(type).decode;
    const std::size_t blocks = static_cast<std::size_t>(cols) / ggml::traits(type).block_values;
    decode(bytes.data() + static_cast<std::size_t>(r0) * row_bytes,
           blocks * static_cast<std::size_t>(n), out);
  }

  /// y[i] = a_i . row r for M (1 to 4) activation rows a[M][cols] (lda), straight from the
  /// row's blocks: the type's vector kernel where this build has one
  /// (detail::fused_dot_type(type); a caller decodes a panel for its GEMM otherwise), its
  /// generic one elsewhere. O(M cols).
  template <int M>
  void dot_row(Eigen::Index r, const float* a, Eigen::Index lda, float* y) const noexcept {
    static_assert(M >= 1 && M <= 4, "dot_row: 1 to 4 activation rows");
    ggml::kernels(type).dot_f32[M - 1](bytes.data() + static_cast<std::size_t>(r) * row_bytes, cols,
                                       a, lda, y);
  }

  /// The same rows reordered: row i of the result is row from[i] of this (a row is one output
  /// feature, whole blocks, so a permutation of features moves bytes only). Throws
  /// prepack::error for a mapping of another length or an index out of range.
  quantized_matrix permuted_rows(const std::vector<std::size_t>& from) const {
    prepack::detail::require(from.size() == static_cast<std::size_t>(rows),
                             "permuted_rows: ", from.size(), " indices for ", rows, " rows");
    quantized_matrix q = *this;
    for (std::size_t i = 0; i < from.size(); ++i) {
      prepack::detail::require(from[i] < from.size(), "permuted_rows: index ", i, " = ", from[i],
                               " outside ", rows, " rows");
      std::copy_n(bytes.data() + from[i] * row_bytes, row_bytes, q.bytes.data() + i * row_bytes);
    }
    return q;
  }
};

/// The projections of one layer a source hands over in the file's encoding; each one non-empty
/// here stands in for the fp32 matrix of the same name in layer_weights (then empty).
struct quantized_projections {
  quantized_matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  bool any() const noexcept {
    return !(wq.empty() && wk.empty() && wv.empty() && wo.empty() && w_gate.empty() &&
             w_up.empty() && w_down.empty());
  }
};

}  // namespace reference
PREPACK_NAMESPACE_END
