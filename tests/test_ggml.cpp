// Tests of the ggml component (prepack/ggml/): the traits table against the kernel table and
// the block structs, each type's int8 form against its exact decoding (ggml's definition), and
// every kernel the table dispatches to (the vector ones where this build has them) against the
// generic oracle: the block decoded exactly, then its products summed in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "prepack/ggml/kernels.hpp"
#include "prepack/ggml/quants.hpp"
#include "prepack/ggml/types.hpp"
#include "prepack/numeric.hpp"

namespace {

using prepack::ggml::ggml_type;
namespace ggml = prepack::ggml;

std::vector<ggml_type> quantized_types() {
  std::vector<ggml_type> out;
  ggml::for_each_quantized([&](ggml_type t) { out.push_back(t); });
  return out;
}

// Offsets of a block's fp16 fields (its scales and mins), from the structs.
std::vector<std::size_t> fp16_fields(ggml_type t) {
  switch (t) {
    case ggml_type::q4_0:
      return {offsetof(ggml::block_q4_0, d)};
    case ggml_type::q4_1:
      return {offsetof(ggml::block_q4_1, d), offsetof(ggml::block_q4_1, m)};
    case ggml_type::q5_0:
      return {offsetof(ggml::block_q5_0, d)};
    case ggml_type::q5_1:
      return {offsetof(ggml::block_q5_1, d), offsetof(ggml::block_q5_1, m)};
    case ggml_type::q8_0:
      return {offsetof(ggml::block_q8_0, d)};
    case ggml_type::q2_k:
      return {offsetof(ggml::block_q2_k, d), offsetof(ggml::block_q2_k, dmin)};
    case ggml_type::q3_k:
      return {offsetof(ggml::block_q3_k, d)};
    case ggml_type::q4_k:
      return {offsetof(ggml::block_q4_k, d), offsetof(ggml::block_q4_k, dmin)};
    case ggml_type::q5_k:
      return {offsetof(ggml::block_q5_k, d), offsetof(ggml::block_q5_k, dmin)};
    case ggml_type::q6_k:
      return {offsetof(ggml::block_q6_k, d)};
    case ggml_type::iq4_nl:
      return {offsetof(ggml::block_iq4_nl, d)};
    case ggml_type::iq4_xs:
      return {offsetof(ggml::block_iq4_xs, d)};
    default:
      return {};
  }
}

// n values of type t as random blocks: random bytes, every fp16 field a finite scale of either
// sign in [2^-12, 2^-4].
std::vector<unsigned char> random_row(ggml_type t, std::int64_t n, std::mt19937& rng) {
  const auto& tr = ggml::traits(t);
  const std::int64_t blocks = n / tr.block_values;
  std::vector<unsigned char> bytes(static_cast<std::size_t>(blocks) * tr.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> mag(-12.0f, -4.0f);
  for (auto& b : bytes) b = static_cast<unsigned char>(byte(rng));
  for (std::int64_t k = 0; k < blocks; ++k) {
    for (std::size_t off : fp16_fields(t)) {
      const float v = std::exp2(mag(rng)) * (byte(rng) % 2 == 0 ? 1.0f : -1.0f);
      const std::uint16_t h = prepack::half(v).bits;
      bytes[static_cast<std::size_t>(k) * tr.block_bytes + off] = static_cast<unsigned char>(h);
      bytes[static_cast<std::size_t>(k) * tr.block_bytes + off + 1] =
          static_cast<unsigned char>(h >> 8);
    }
  }
  return bytes;
}

TEST(Ggml, TraitsAndKernelTablesAgreeOnEveryTypeNumber) {
  int decoded = 0;
  for (std::uint32_t n = 0; n < ggml::type_count + 3; ++n) {
    const auto t = static_cast<ggml_type>(n);
    const ggml::type_traits& tr = ggml::traits(t);
    const ggml::cpu_kernels& k = ggml::kernels(t);
    SCOPED_TRACE("type number " + std::to_string(n));
    EXPECT_EQ(tr.decodes, k.decode != nullptr);
    EXPECT_EQ(tr.decodes, k.decode_exact != nullptr);
    for (int m = 0; m < 4; ++m) {
      EXPECT_EQ(tr.decodes, k.dot_f32[m] != nullptr);
      EXPECT_EQ(tr.int8_dot, k.dot_q8[m] != nullptr);
    }
    EXPECT_TRUE(!tr.int8_dot || tr.quantized);
    EXPECT_TRUE(!tr.quantized || tr.decodes);
    if (tr.decodes) {
      ++decoded;
      EXPECT_NE(tr.name, nullptr);
      EXPECT_GT(tr.block_values, 0u);
      EXPECT_GT(tr.block_bytes, 0u);
    } else {
      EXPECT_EQ(tr.block_values, 0u);
    }
    if (n >= ggml::type_count) {
      EXPECT_EQ(tr.name, nullptr);
    }
  }
  EXPECT_EQ(decoded, 15);  // F32, F16, BF16 and the 12 block types
  EXPECT_EQ(quantized_types().size(), 12u);
  // The sizes ggml-common.h gives each block (bytes per block / values per block).
  EXPECT_EQ(ggml::traits(ggml_type::q4_k).block_bytes, 144u);
  EXPECT_EQ(ggml::traits(ggml_type::q6_k).block_bytes, 210u);
  EXPECT_EQ(ggml::traits(ggml_type::iq4_xs).block_bytes, 136u);
  EXPECT_EQ(ggml::traits(ggml_type::q2_k).block_bytes, 84u);
  EXPECT_STREQ(ggml::ggml_type_name(ggml_type::iq2_xs), "IQ2_XS");
  EXPECT_FALSE(ggml::traits(ggml_type::iq2_xs).decodes);
}

// Value n of a block is rounded(scale[n / 16] v[n]) + min[n / 32]: bit for bit ggml's exact
// decoding, for every type with an int8 form.
template <ggml_type T>
void expect_int8_form_decodes(std::mt19937& rng) {
  if constexpr (ggml::traits(T).int8_dot) {
    constexpr int values = ggml::block_values<T>;
    for (int rep = 0; rep < 50; ++rep) {
      const auto bytes = random_row(T, values, rng);
      float exact[values];
      ggml::decode_block<T, true>(bytes.data(), exact);
      ggml::detail::int8_form<values> f;
      ggml::detail::to_int8(ggml::block_at<typename ggml::block_for<T>::type>(bytes.data()), f);
      for (int n = 0; n < values; ++n) {
        const float v =
            ggml::detail::rounded(f.scale[n / 16] * static_cast<float>(f.v[n])) + f.min[n / 32];
        ASSERT_EQ(v, exact[n]) << ggml::ggml_type_name(T) << " value " << n;
      }
    }
  }
}

TEST(Ggml, Int8FormsAreTheExactDecoding) {
  std::mt19937 rng(7);
  expect_int8_form_decodes<ggml_type::q4_0>(rng);
  expect_int8_form_decodes<ggml_type::q4_1>(rng);
  expect_int8_form_decodes<ggml_type::q5_0>(rng);
  expect_int8_form_decodes<ggml_type::q5_1>(rng);
  expect_int8_form_decodes<ggml_type::q8_0>(rng);
  expect_int8_form_decodes<ggml_type::q3_k>(rng);
  expect_int8_form_decodes<ggml_type::q4_k>(rng);
  expect_int8_form_decodes<ggml_type::q5_k>(rng);
  expect_int8_form_decodes<ggml_type::q6_k>(rng);
  expect_int8_form_decodes<ggml_type::iq4_nl>(rng);
  expect_int8_form_decodes<ggml_type::iq4_xs>(rng);
}

// Every type's fp32 dot (the table's entry: the vector kernel where built) at 1 to 4 rows, on
// rows of 1, an odd number and many blocks (19: past 8, where the int8 dots' 8 chains of mins
// wrap around, and 4-block steps followed by a pair and a single block), against the exact
// decoding dotted in double.
TEST(Ggml, Fp32DotsEqualTheDecodedRowsDotted) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (ggml_type t : quantized_types()) {
    const auto& tr = ggml::traits(t);
    for (std::int64_t blocks : {1, 3, 8, 19}) {
      const std::int64_t k = blocks * tr.block_values;
      const auto row = random_row(t, k, rng);
      std::vector<float> w(static_cast<std::size_t>(k));
      ggml::dequantize(t, row.data(), w.size(), w.data());
      const std::int64_t lda = k + 3;
      std::vector<float> a(static_cast<std::size_t>(4 * lda));
      for (float& x : a) x = normal(rng);
      for (int m = 1; m <= 4; ++m) {
        float y[4] = {};
        ggml::kernels(t).dot_f32[m - 1](row.data(), k, a.data(), lda, y);
        for (int i = 0; i < m; ++i) {
          double want = 0, scale = 0;
          for (std::int64_t j = 0; j < k; ++j) {
            want += static_cast<double>(w.data()[j]) * a.data()[i * lda + j];
            scale += std::fabs(static_cast<double>(w.data()[j]) * a.data()[i * lda + j]);
          }
          EXPECT_NEAR(y[i], want, 1e-5 * scale + 1e-30)
              << tr.name << " " << blocks << " blocks, row " << i << " of " << m
              << (ggml::kernels(t).dot_f32_vector ? " (vector)" : " (generic)");
        }
      }
    }
  }
}

// Every int8 dot the table holds against the int8 form's sums in double (the same integers and
// scales: only the order of the fp32 roundings may differ), and within the quantization bound
// of the fp32 dot.
TEST(Ggml, Int8DotsEqualTheirIntegerSums) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  for (ggml_type t : quantized_types()) {
    const auto& tr = ggml::traits(t);
    if (!tr.int8_dot) continue;
    for (std::int64_t blocks : {1, 3, 8, 19}) {
      const std::int64_t k = blocks * tr.block_values;
      const auto row = random_row(t, k, rng);
      std::vector<float> w(static_cast<std::size_t>(k));
      ggml::dequantize(t, row.data(), w.size(), w.data());
      std::vector<float> x(static_cast<std::size_t>(4 * k));
      for (float& v : x) v = normal(rng);
      ggml::int8_rows a;
      a.reset(4, k);
      for (int i = 0; i < 4; ++i) a.quantize_row(i, x.data() + i * k);
      for (int m = 1; m <= 4; ++m) {
        float y[4] = {};
        ggml::kernels(t).dot_q8[m - 1](row.data(), k, a, 0, y);
        for (int i = 0; i < m; ++i) {
          // w . (d_b q) over the blocks, plus the mins' terms against the exact sums: the
          // value each int8 dot computes, in double
          double want = 0, scale = 0, bound = 0, fp32 = 0;
          for (std::int64_t j = 0; j < k; ++j) {
            const std::int64_t b = j / 32;
            const double db = a.d[static_cast<std::size_t>(i * (k / 32) + b)];
            const double q = a.q[static_cast<std::size_t>(i * k + j)];
            const double wj = w.data()[j];
            want += wj * db * q;
            scale += std::fabs(wj * db * q);
            fp32 += wj * x.data()[i * k + j];
            bound += db / 2 * std::fabs(wj);
          }
          // Types with mins (Q4_1, Q5_1, Q4_K, Q5_K) multiply them with the exact sums s_b:
          // their dots are checked against the generic kernel (VectorKernelsEqualTheGenericOnes)
          // and through the model (test_reference's Int8ActivationsDotWithinTheirBound).
          const bool mins = tr.name == std::string("Q4_1") || tr.name == std::string("Q5_1") ||
                            tr.name == std::string("Q4_K") || tr.name == std::string("Q5_K");
          if (!mins) {
            EXPECT_NEAR(y[i], fp32, bound * 1.0001 + 1e-4 * scale)
                << tr.name << " " << blocks << " blocks, row " << i << " of " << m
                << (ggml::kernels(t).dot_q8_vector ? " (vector)" : " (generic)");
            EXPECT_NEAR(y[i], want, 1e-5 * scale + 1e-30) << tr.name << " (no mins)";
          }
        }
      }
    }
  }
}

// The vector kernels (where this build has them) against the generic ones, type by type.
template <ggml_type T>
void expect_vector_equals_generic(std::mt19937& rng) {
  std::normal_distribution<float> normal;
  // 19 32-value blocks: past the int8 dots' 8 chains of mins, and 4-block steps followed by a
  // pair and a single block; 5 blocks of 256
  const std::int64_t k = ggml::block_values<T> == 32 ? 19 * 32 : 5 * ggml::block_values<T>;
  const auto row = random_row(T, k, rng);
  std::vector<float> a(static_cast<std::size_t>(3 * k));
  for (float& x : a) x = normal(rng);
  float y[3], g[3];
  ggml::kernels(T).dot_f32[2](row.data(), k, a.data(), k, y);
  ggml::dot_f32_generic<T, 3>(row.data(), k, a.data(), k, g);
  std::vector<float> w(static_cast<std::size_t>(k));
  ggml::decode_blocks_generic<T, true>(
      row.data(), static_cast<std::size_t>(k / ggml::block_values<T>), w.data());
  for (int i = 0; i < 3; ++i) {
    // the two differ only in the order of their fp32 roundings: far within 1e-6 of sum |w a|
    double scale = 0;
    for (std::int64_t j = 0; j < k; ++j) scale += std::fabs(w.data()[j] * a.data()[i * k + j]);
    EXPECT_NEAR(y[i], g[i], 1e-6 * scale) << ggml::ggml_type_name(T) << " fp32 row " << i;
  }
  if constexpr (ggml::traits(T).int8_dot) {
    ggml::int8_rows q;
    q.reset(3, k);
    for (int i = 0; i < 3; ++i) q.quantize_row(i, a.data() + i * k);
    ggml::kernels(T).dot_q8[2](row.data(), k, q, 0, y);
    ggml::dot_q8_generic<T, 3>(row.data(), k, q, 0, g);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(y[i], g[i], 1e-5 * (std::fabs(g[i]) + 1.0f))
          << ggml::ggml_type_name(T) << " int8 row " << i;
    }
  }
  std::vector<float> fast(static_cast<std::size_t>(k)), exact(static_cast<std::size_t>(k));
  ggml::dequantize_fast(T, row.data(), fast.size(), fast.data());
  ggml::decode_blocks_generic<T, true>(
      row.data(), static_cast<std::size_t>(k / ggml::block_values<T>), exact.data());
  for (std::int64_t j = 0; j < k; ++j) {
    ASSERT_NEAR(fast.data()[j], exact.data()[j], std::fabs(exact.data()[j]) * 1.2e-7f + 1e-30f)
        << ggml::ggml_type_name(T) << " value " << j;
  }
}

TEST(Ggml, VectorKernelsEqualTheGenericOnes) {
  std::mt19937 rng(17);
  expect_vector_equals_generic<ggml_type::q4_0>(rng);
  expect_vector_equals_generic<ggml_type::q4_1>(rng);
  expect_vector_equals_generic<ggml_type::q5_0>(rng);
  expect_vector_equals_generic<ggml_type::q5_1>(rng);
  expect_vector_equals_generic<ggml_type::q8_0>(rng);
  expect_vector_equals_generic<ggml_type::q2_k>(rng);
  expect_vector_equals_generic<ggml_type::q3_k>(rng);
  expect_vector_equals_generic<ggml_type::q4_k>(rng);
  expect_vector_equals_generic<ggml_type::q5_k>(rng);
  expect_vector_equals_generic<ggml_type::q6_k>(rng);
  expect_vector_equals_generic<ggml_type::iq4_nl>(rng);
  expect_vector_equals_generic<ggml_type::iq4_xs>(rng);
}

TEST(GgmlErrors, DequantizeRefusesUndecodedTypesAndPartialBlocks) {
  const std::vector<unsigned char> bytes(512, 0);
  std::vector<float> out(256, -1.0f);
  try {
    ggml::dequantize(ggml_type::iq2_xs, bytes.data(), 256, out.data());
    ADD_FAILURE() << "IQ2_XS decoded";
  } catch (const prepack::error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XS (17) cannot be dequantized"), std::string::npos)
        << e.what();
  }
  try {
    ggml::dequantize(static_cast<ggml_type>(77), bytes.data(), 32, out.data());
    ADD_FAILURE() << "type 77 decoded";
  } catch (const prepack::error& e) {
    EXPECT_NE(std::string(e.what()).find("77"), std::string::npos) << e.what();
  }
  try {
    ggml::dequantize(ggml_type::q4_k, bytes.data(), 200, out.data());
    ADD_FAILURE() << "200 Q4_K values decoded";
  } catch (const prepack::error& e) {
    EXPECT_NE(std::string(e.what()).find("200 values are not a whole number of 256-value blocks"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == -1.0f; }));
  // dequantize_fast writes nothing for a type it does not decode
  ggml::dequantize_fast(ggml_type::iq2_xs, bytes.data(), 256, out.data());
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == -1.0f; }));
}

}  // namespace
