// Tests of prepack/reference: the heart of the suite. Prefilling a packed batch (both attention
// paths, both packers) or a padded batch (left and right) gives every prompt the KV cache and
// last-token logits it gets when prefilled alone, and the same greedy continuation, on every
// GEMM backend of the build; the kernel alone agrees with a plain-loop forward pass written here
// in double precision (biases and tied embeddings included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "held_weights.hpp"
#include "reference_common.hpp"

namespace {

namespace ref = prepack::reference;
using namespace test;
constexpr double kTolerance = 1e-4;

struct method {
  const char* name;
  bool padded;
  prepack::padding_side side;
  prepack::packer packer;
  ref::attention path;
  bool larger_capacity;
};

const method kMethods[] = {
    {"ffd/segment", false, prepack::padding_side::left, prepack::packer::first_fit_decreasing,
     ref::attention::segment, false},
    {"ffd/dense", false, prepack::padding_side::left, prepack::packer::first_fit_decreasing,
     ref::attention::dense, false},
    {"bfd/segment", false, prepack::padding_side::left, prepack::packer::best_fit_decreasing,
     ref::attention::segment, true},
    {"bfd/dense", false, prepack::padding_side::left, prepack::packer::best_fit_decreasing,
     ref::attention::dense, true},
    {"padded-left/dense", true, prepack::padding_side::left, prepack::packer::first_fit_decreasing,
     ref::attention::dense, false},
    {"padded-right/dense", true, prepack::padding_side::right,
     prepack::packer::first_fit_decreasing, ref::attention::dense, false},
    {"padded-left/segment", true, prepack::padding_side::left,
     prepack::packer::first_fit_decreasing, ref::attention::segment, false},
};

TEST(Reference, KernelAloneMatchesPlainLoopForwardPass) {
  for (ref::gemm_backend be : backends()) {
    std::mt19937_64 rng(1);
    double worst = 0;
    int biased = 0, tied = 0, qk_normed = 0, scaled = 0;
    for (int trial = 0; trial < 12; ++trial) {
      const ref::config c = random_config(rng);
      const std::uint64_t seed = rng();
      const ref::weights w = ref::random_weights(c, seed);
      const ref::model m(c, seed);
      biased += c.qkv_bias;
      tied += c.tied_embeddings;
      qk_normed += c.qk_norm;
      scaled += !c.rope_freq_factors.empty();
      const auto prompts =
          random_prompts(rng, test::random_lengths(rng, 3, 1, 40 + trial * 25), c.vocab);
      const auto [cache, logits] =
          ref::prefill_alone(m, prompts, 0, {ref::attention::segment, 0, be});
      const std::size_t kv = static_cast<std::size_t>(c.kv_dim());
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        const naive_result n = naive_prefill(c, w, prompts[i]);
        const auto& seq = cache.seqs[i];
        for (int layer = 0; layer < c.n_layers; ++layer) {
          for (std::size_t p = 0; p < prompts[i].size(); ++p) {
            const std::size_t at = seq.slot(p, cache.pool.block_size()) * kv;
            for (std::size_t e = 0; e < kv; ++e) {
              const std::size_t want = p * kv + e;
              worst = std::max(worst, std::abs(cache.pool.keys(layer)[at + e] -
                                               n.k[static_cast<std::size_t>(layer)][want]));
              worst = std::max(worst, std::abs(cache.pool.values(layer)[at + e] -
                                               n.v[static_cast<std::size_t>(layer)][want]));
            }
          }
        }
        for (int j = 0; j < c.vocab; ++j) {
          worst = std::max(worst, std::abs(logits(static_cast<Eigen::Index>(i), j) -
                                           n.logits[static_cast<std::size_t>(j)]));
        }
      }
    }
    std::printf(
        "[%s] kernel alone vs plain loops (double): max abs diff %.3g (%d configs with "
        "biases, %d tied, %d with Q/K norms, %d with scaled RoPE)\n",
        ref::backend_name(be), worst, biased, tied, qk_normed, scaled);
    EXPECT_LE(worst, kTolerance) << ref::backend_name(be);
    EXPECT_GT(biased, 0);
    EXPECT_GT(tied, 0);
    EXPECT_GT(qk_normed, 0);
    EXPECT_GT(scaled, 0);
  }
}

TEST(Reference, PackedAndPaddedPrefillEqualPrefillingEachPromptAlone) {
  for (ref::gemm_backend be : backends()) {
    std::mt19937_64 rng(2);
    diff worst[std::size(kMethods)];
    int near_ties = 0, int8_layers = 0;
    for (int trial = 0; trial < 10; ++trial) {
      ref::config c = random_config(rng);
      if (trial % 4 == 3) c = test::whole_blocks(c);
      const std::uint64_t seed = rng();
      // Odd trials hold the projections quantized (Q8_0 rows, decoded inside the GEMMs); 3 and
      // 7 dot them with 8-bit activations.
      const ref::model m =
          trial % 2 ? test::held_model(c, seed, trial % 4 == 3) : ref::model(c, seed);
      int8_layers += m.int8_layers().first;
      // With 8-bit activations the dense path's attention sums (over key tiles that start where
      // the packed row does) can move an activation across a rounding step: test::slack_for.
      const test::slack sl = test::slack_for(m);
      const auto prompts = random_prompts(rng, random_prompt_lengths(rng, trial), c.vocab);
      const auto len = lengths_of(prompts);
      const int new_tokens = 8;
      auto [alone, alone_logits] =
          ref::prefill_alone(m, prompts, new_tokens, {ref::attention::segment, 0, be});
      const auto want = ref::greedy_decode(m, alone, alone_logits, new_tokens, {0, be});
      for (const auto& k : want.margins) {
        near_ties +=
            static_cast<int>(std::count_if(k.begin(), k.end(), [](float x) { return x < 1e-3f; }));
      }
      auto [fresh, fresh_logits] =
          ref::prefill_alone(m, prompts, new_tokens, {ref::attention::segment, 0, be});
      const int longest = *std::max_element(len.begin(), len.end());
      for (std::size_t mi = 0; mi < std::size(kMethods); ++mi) {
        const method& me = kMethods[mi];
        const std::optional<int> cap =
            me.larger_capacity ? std::optional<int>(longest + 37) : std::nullopt;
        const auto plan = me.padded ? prepack::padded(len, me.side, cap)
                                    : prepack::make_plan(me.packer, len, cap);
        const auto l = prepack::make_layout(plan, prompts, {c.pad_id, 1});
        const auto r = m.prefill(l, {me.path, 0, be});
        for (float e : r.keys) ASSERT_TRUE(std::isfinite(e)) << me.name << ": non-finite key";
        for (float e : r.values) ASSERT_TRUE(std::isfinite(e)) << me.name << ": non-finite value";
        auto caches = ref::unpack_caches(m, l, r, new_tokens);
        const diff d = compare(fresh, fresh_logits, caches, r.logits);
        worst[mi].kv = std::max(worst[mi].kv, d.kv);
        worst[mi].logits = std::max(worst[mi].logits, d.logits);
        ASSERT_LE(d.kv, std::max(kTolerance, sl.kv)) << me.name << " trial " << trial;
        ASSERT_LE(d.logits, std::max(kTolerance, sl.logits)) << me.name << " trial " << trial;
        const auto got = ref::greedy_decode(m, caches, r.logits, new_tokens, {0, be});
        expect_same_tokens(want, got, me.name, sl.tie);
      }
    }
    for (std::size_t mi = 0; mi < std::size(kMethods); ++mi) {
      std::printf("[%s] %-20s vs alone: max abs diff KV %.3g, logits %.3g\n", ref::backend_name(be),
                  kMethods[mi].name, worst[mi].kv, worst[mi].logits);
    }
    std::printf("greedy steps at a near-tie (margin < 1e-3) in the reference: %d\n", near_ties);
    EXPECT_GT(int8_layers, 0) << "no trial dotted 8-bit activations";
  }
}

// Eigen and oneDNN compute the same function (when the build has both).
TEST(Reference, BackendsAgree) {
  if (!ref::onednn_available()) GTEST_SKIP() << "this build has no oneDNN";
  std::mt19937_64 rng(6);
  double worst = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const ref::config c = random_config(rng);
    const std::uint64_t seed = rng();
    const auto prompts = random_prompts(rng, random_prompt_lengths(rng, trial), c.vocab);
    const auto l =
        prepack::make_layout(prepack::first_fit_decreasing(lengths_of(prompts)), prompts);
    // Plain Eigen is the reference; every other layout and backend pair agrees with it.
    const ref::model plain(c, seed, {ref::weight_type::f32, ref::gemm_backend::eigen});
    const auto a = plain.prefill(l, {ref::attention::segment, 0, ref::gemm_backend::eigen});
    EXPECT_EQ(a.profile.backend, ref::gemm_backend::eigen);
    for (ref::gemm_backend layout : backends()) {
      const ref::model m(c, seed, {ref::weight_type::f32, layout});
      for (ref::gemm_backend be : backends()) {
        const auto b = m.prefill(l, {ref::attention::segment, 0, be});
        EXPECT_EQ(b.profile.backend, be);
        worst = std::max<double>(worst, (a.logits - b.logits).cwiseAbs().maxCoeff());
      }
    }
  }
  std::printf("layouts and backends vs plain eigen: max abs diff logits %.3g\n", worst);
  EXPECT_LE(worst, kTolerance);
}

// bf16 projection weights (activations rounded to bf16, fp32 accumulation): prepacked and
// alone compute the same bf16 model, up to the bf16 rounding that an fp32 accumulation-order
// difference can flip (bound: 0.5% of the logits' scale, 1% of the values' for KV); how far bf16
// moves logits from fp32 is printed and bounded (2%).
TEST(Reference, Bf16WeightsAgreeWithAloneWithinTheirBound) {
  for (ref::gemm_backend be : backends()) {
    std::mt19937_64 rng(8);
    double worst_packed = 0, worst_kv = 0, worst_f32 = 0, scale = 0;
    for (int trial = 0; trial < 6; ++trial) {
      const ref::config c = random_config(rng);
      const std::uint64_t seed = rng();
      const ref::model f32(c, seed), bf16(c, seed, {ref::weight_type::bf16});
      EXPECT_EQ(bf16.weights_type(), ref::weight_type::bf16);
      const auto prompts = random_prompts(rng, random_prompt_lengths(rng, trial), c.vocab);
      const auto l =
          prepack::make_layout(prepack::first_fit_decreasing(lengths_of(prompts)), prompts);
      const auto [alone, alone_logits] =
          ref::prefill_alone(bf16, prompts, 0, {ref::attention::segment, 0, be});
      const auto r = bf16.prefill(l, {ref::attention::segment, 0, be});
      const auto rf = f32.prefill(l, {ref::attention::segment, 0, be});
      const double s = std::max(1.0, static_cast<double>(rf.logits.cwiseAbs().maxCoeff()));
      scale = std::max(scale, s);
      worst_packed =
          std::max<double>(worst_packed, (r.logits - alone_logits).cwiseAbs().maxCoeff() / s);
      worst_kv =
          std::max<double>(worst_kv, ref::max_abs_diff(alone, ref::unpack_caches(bf16, l, r)));
      worst_f32 = std::max<double>(worst_f32, (r.logits - rf.logits).cwiseAbs().maxCoeff() / s);
    }
    std::printf(
        "[%s] bf16 weights: prepacked vs alone %.3g of the logits' scale, KV %.3g; bf16 vs "
        "fp32 %.3g of the logits' scale (up to %.3g)\n",
        ref::backend_name(be), worst_packed, worst_kv, worst_f32, scale);
    EXPECT_LE(worst_packed, 5e-3) << ref::backend_name(be);
    EXPECT_LE(worst_kv, 1e-2) << ref::backend_name(be);
    EXPECT_LE(worst_f32, 2e-2) << ref::backend_name(be);
    EXPECT_GT(worst_f32, 1e-5) << "bf16 weights computed exactly the fp32 model?";
  }
}

// The two bf16 paths (oneDNN's bf16 matmul where this CPU runs it; fp32 GEMMs over bf16-rounded
// values elsewhere, and always on Eigen) compute the same model: products of bf16 values
// accumulated in fp32. With ONEDNN_MAX_CPU_ISA capping oneDNN below AVX512_CORE_BF16 (CI's
// AVX2-only run, and the test "test_reference_bf16_avx2"), oneDNN must not be asked for bf16 and
// the emulated path must run instead.
TEST(Reference, Bf16PathsAgreeAndFollowTheCpu) {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string isa = cap != nullptr ? cap : "";
  const bool capped_below_bf16 = !isa.empty() && isa.find("BF16") == std::string::npos &&
                                 isa.find("AMX") == std::string::npos && isa != "ALL" &&
                                 isa != "DEFAULT";
  EXPECT_FALSE(ref::bf16_path(ref::gemm_backend::eigen).native);
  EXPECT_EQ(ref::bf16_path(ref::gemm_backend::eigen).describe(), "emulated on eigen");
  if (capped_below_bf16) {
    for (ref::gemm_backend be : backends()) {
      EXPECT_FALSE(ref::bf16_path(be).native)
          << ref::backend_name(be) << " with ONEDNN_MAX_CPU_ISA=" << isa << ": "
          << ref::bf16_path(be).describe();
    }
  }
  std::mt19937_64 rng(21);
  const ref::config c = random_config(rng);
  const ref::model m(c, rng(), {ref::weight_type::bf16});
  const auto prompts = random_prompts(rng, test::heavy_tailed_lengths(rng, 12, 90), c.vocab);
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(lengths_of(prompts)), prompts);
  const auto e = m.prefill(l, {ref::attention::segment, 0, ref::gemm_backend::eigen});
  for (ref::gemm_backend be : backends()) {
    const auto r = m.prefill(l, {ref::attention::segment, 0, be});
    const double s = std::max(1.0, static_cast<double>(e.logits.cwiseAbs().maxCoeff()));
    EXPECT_LE((r.logits - e.logits).cwiseAbs().maxCoeff() / s, 5e-3)
        << ref::bf16_path(be).describe() << " against "
        << ref::bf16_path(ref::gemm_backend::eigen).describe();
  }
}

// A linear layer holds one form and answers for it alone: a default one is dense fp32 with no
// weights and multiplies nothing; a quantized one answers the dense accessors empty, and the
// dense one the quantized accessors; both multiply as the product of what widened() returns.
TEST(Reference, LinearHoldsOneFormAndAnswersForIt) {
  const ref::linear none;
  ASSERT_NE(none.dense(), nullptr);
  EXPECT_EQ(none.dense()->held_as(), ref::dense_linear::form::plain_f32);
  EXPECT_EQ(none.in(), 0);
  EXPECT_EQ(none.out(), 0);
  EXPECT_EQ(none.bytes(), 0u);
  EXPECT_TRUE(none.quantized_segments().empty());
  EXPECT_EQ(none.input_scale().size(), 0);
  ref::gemm_scratch scratch;
  float a = 1.0f, c = 7.0f;
  for (ref::gemm_backend be : backends()) none.apply(be, 1, &a, 0, &c, 0, false, scratch);
  EXPECT_EQ(c, 7.0f) << "a layer with no outputs wrote one";
  // No inputs: every output is the empty sum (or what it was, accumulating).
  for (ref::gemm_backend be : backends()) {
    const ref::linear empty_in(ref::matrix(0, 3), false, ref::weight_type::f32, be);
    float y[3] = {1.0f, 2.0f, 3.0f};
    empty_in.apply(be, 1, &a, 0, y, 3, true, scratch);
    EXPECT_EQ(y[2], 3.0f) << ref::backend_name(be);
    empty_in.apply(be, 1, &a, 0, y, 3, false, scratch);
    EXPECT_EQ(y[2], 0.0f) << ref::backend_name(be);
  }

  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ref::matrix w(48, 64);  // [out][in]
  for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = normal(rng);
  ref::vector scale(64);
  for (Eigen::Index i = 0; i < scale.size(); ++i) scale[i] = 0.5f + 0.01f * static_cast<float>(i);
  // two Q8_0 segments of output rows (held_rows takes [in][out])
  const ref::linear q(
      std::vector<ref::quantized_matrix>{
          test::held_rows(ref::matrix(w.topRows(16).transpose())),
          test::held_rows(ref::matrix(w.bottomRows(32).transpose()))},
      scale);
  EXPECT_EQ(q.quantized_segments()[0].type, prepack::ggml::ggml_type::q8_0);
  ASSERT_NE(q.quantized_form(), nullptr);
  EXPECT_EQ(q.dense(), nullptr);
  EXPECT_TRUE(q.quantized());
  EXPECT_TRUE(q.transposed());
  EXPECT_FALSE(q.held_by_onednn());
  EXPECT_EQ(q.weights().size(), 0);
  EXPECT_TRUE(q.weights_bf16().empty());
  EXPECT_EQ(q.quantized_segments().size(), 2u);
  EXPECT_EQ(q.input_scale(), scale);
  EXPECT_EQ(q.in(), 64);
  EXPECT_EQ(q.out(), 48);
  std::size_t blocks = static_cast<std::size_t>(scale.size()) * sizeof(float);
  for (const auto& s : q.quantized_segments()) blocks += s.bytes.size();
  EXPECT_EQ(q.bytes(), blocks);
  const ref::matrix wq = q.widened();  // the rows as the blocks define them
  ASSERT_EQ(wq.rows(), 48);
  ASSERT_EQ(wq.cols(), 64);
  const ref::linear d(wq, true, ref::weight_type::f32);
  EXPECT_EQ(d.quantized_segments().size(), 0u);
  EXPECT_FALSE(d.int8_activations());
  for (const Eigen::Index m : {Eigen::Index{1}, Eigen::Index{12}, Eigen::Index{300}}) {
    ref::matrix x(m, 64), yq(m, 48), yd(m, 48);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);
    const ref::matrix xs = x * scale.asDiagonal();
    q.apply(ref::gemm_backend::eigen, m, x.data(), 64, yq.data(), 48, false, scratch);
    d.apply(ref::gemm_backend::eigen, m, xs.data(), 64, yd.data(), 48, false, scratch);
    const Eigen::MatrixXd want = xs.cast<double>() * wq.cast<double>().transpose();
    const Eigen::MatrixXd size =
        xs.cast<double>().cwiseAbs() * wq.cast<double>().cwiseAbs().transpose();
    for (Eigen::Index r = 0; r < m; ++r) {
      for (Eigen::Index j = 0; j < 48; ++j) {
        EXPECT_NEAR(yq(r, j), want(r, j), 1e-5 * size(r, j))
            << m << " rows, row " << r << ", output " << j;
        EXPECT_NEAR(yd(r, j), want(r, j), 1e-5 * size(r, j))
            << m << " rows, row " << r << ", output " << j;
      }
    }
  }
}

// The bf16 speed probe reports what it measured and how bf16 ran (the path bf16_path names),
// never a speed it did not time, and refuses a shape or repeat count it cannot time, naming the
// value. Its speeds are not asserted: they are this CPU's, which is the point.
TEST(Reference, Bf16SpeedProbeTimesBothAndRefusesBadShapes) {
  for (ref::gemm_backend be : backends()) {
    const ref::bf16_speed s = ref::measure_bf16_speed(be, 8, 96, 70, 1, 2);
    EXPECT_EQ(s.path.describe(), ref::bf16_path(be).describe());
    EXPECT_GT(s.f32_seconds, 0.0);
    EXPECT_GT(s.bf16_seconds, 0.0);
    EXPECT_LT(s.f32_seconds, 1e300);
    EXPECT_DOUBLE_EQ(s.ratio(), s.f32_seconds / s.bf16_seconds);
    EXPECT_EQ(s.faster(), s.f32_seconds > s.bf16_seconds);
    EXPECT_EQ(s.threads, 1);
    EXPECT_NE(s.describe().find("a 8 x 96 x 70 GEMM on 1 thread,"), std::string::npos)
        << s.describe();
    EXPECT_NE(s.describe().find(s.path.describe()), std::string::npos) << s.describe();
  }
  const auto eigen = ref::gemm_backend::eigen;
  EXPECT_PREPACK_ERROR((void)ref::measure_bf16_speed(eigen, 0, 4, 4), "shape 0 x 4 x 4");
  EXPECT_PREPACK_ERROR((void)ref::measure_bf16_speed(eigen, 4, 4, -1), "shape 4 x 4 x -1");
  EXPECT_PREPACK_ERROR((void)ref::measure_bf16_speed(eigen, 4, 4, 4, 0, 0), "repeats 0");
  EXPECT_PREPACK_ERROR((void)ref::measure_bf16_speed(eigen, 4, 4, 4, -2), "n_threads -2");
}

// A linear layer holds its weights once, in the layout it was built for (plain, or oneDNN's own
// where oneDNN chooses one: held_by_onednn), fp32 or bf16 (2 bytes a weight, never an fp32
// copy), and on every backend computes what the hardware of its type computes: a w summed in
// fp32, or bf16(a) bf16(w). The oracle is a plain double loop over the (rounded) values, written
// here. The shape is wide enough that the panel paths widen several panels of columns (the last
// one partial) and share them among threads; the row counts take oneDNN's row chunks (fewer than
// 64, 64 and a remainder, 256 and a remainder).
TEST(Reference, LinearOnEveryLayoutAndBackendEqualsTheProduct) {
  std::mt19937_64 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto bf = [](float x) {
    return prepack::bfloat16::to_float(prepack::bfloat16::from_float(x));
  };
  const Eigen::Index k = 4100, n = 530;
  ASSERT_LT(ref::linear::panel_cols(k, n), n) << "one panel: the test would not split any";
  for (const bool transposed : {false, true}) {
    ref::matrix w(transposed ? n : k, transposed ? k : n);
    for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = normal(rng);
    for (const ref::weight_type type : {ref::weight_type::f32, ref::weight_type::bf16}) {
      const bool b16 = type == ref::weight_type::bf16;
      const auto value = [&](float x) { return b16 ? bf(x) : x; };
      std::vector<ref::linear> layers;
      for (ref::gemm_backend layout : backends()) {
        const ref::linear L(w, transposed, type, layout);
        const std::size_t size = static_cast<std::size_t>(w.size()), per = b16 ? 2 : 4;
        EXPECT_EQ(L.held_by_onednn(), ref::held_by_onednn(k, n, type, layout));
        if (layout == ref::gemm_backend::eigen) {
          EXPECT_FALSE(L.held_by_onednn());
        }
        if (L.held_by_onednn()) {
          // oneDNN's layout pads to its blocks: more than the weights, less than fp32's.
          EXPECT_GE(L.bytes(), size * per);
          EXPECT_LT(L.bytes(), size * (per + 1));
          EXPECT_EQ(L.weights().size(), 0);
          EXPECT_TRUE(L.weights_bf16().empty());
        } else {
          EXPECT_EQ(L.bytes(), size * per);
          EXPECT_EQ(L.weights().size(), b16 ? 0 : w.size()) << "a bf16 layer kept an fp32 copy";
          EXPECT_EQ(L.weights_bf16().size(), b16 ? size : 0);
        }
        // One form, the dense one, in the state its accessors describe.
        ASSERT_NE(L.dense(), nullptr);
        EXPECT_EQ(L.quantized_form(), nullptr);
        EXPECT_FALSE(L.quantized());
        EXPECT_EQ(L.type(), type);
        EXPECT_EQ(L.dense()->held_as(), L.held_by_onednn() ? ref::dense_linear::form::onednn
                                        : b16              ? ref::dense_linear::form::plain_bf16
                                                           : ref::dense_linear::form::plain_f32);
        EXPECT_EQ(L.in(), k);
        EXPECT_EQ(L.out(), n);
        // What it holds is the weights, rounded once for bf16, wherever they live.
        const ref::matrix held = L.widened();
        ASSERT_EQ(held.rows(), w.rows());
        ASSERT_EQ(held.cols(), w.cols());
        for (Eigen::Index i = 0; i < w.size(); ++i) {
          ASSERT_EQ(held.data()[i], value(w.data()[i])) << "weight " << i;
        }
        layers.push_back(L);
      }
      for (const Eigen::Index m : {Eigen::Index{1}, Eigen::Index{65}, Eigen::Index{260}}) {
        ref::matrix a(m, k + 3);  // lda > k
        for (Eigen::Index i = 0; i < a.size(); ++i) a.data()[i] = normal(rng);
        ref::matrix c0(m, n + 5);  // ldc > n
        for (Eigen::Index i = 0; i < c0.size(); ++i) c0.data()[i] = normal(rng);
        // In double precision, over the values as the hardware sees them.
        Eigen::MatrixXd ad(m, k), wd(k, n);
        for (Eigen::Index r = 0; r < m; ++r) {
          for (Eigen::Index i = 0; i < k; ++i) ad(r, i) = value(a(r, i));
        }
        for (Eigen::Index i = 0; i < k; ++i) {
          for (Eigen::Index j = 0; j < n; ++j) wd(i, j) = value(transposed ? w(j, i) : w(i, j));
        }
        const Eigen::MatrixXd product = ad * wd;
        const Eigen::MatrixXd magnitude = ad.cwiseAbs() * wd.cwiseAbs();
        for (const ref::linear& L : layers) {
          for (ref::gemm_backend be : backends()) {
            test::for_threads({1, 2, 3}, [&](int threads) {
              for (const bool accumulate : {false, true}) {
                ref::matrix c = c0;
                ref::gemm_scratch scratch;
                L.apply(be, m, a.data(), a.cols(), c.data(), c.cols(), accumulate, scratch);
                double worst = 0;
                for (Eigen::Index r = 0; r < m; ++r) {
                  for (Eigen::Index j = 0; j < n; ++j) {
                    const double want = product(r, j) + (accumulate ? c0(r, j) : 0.0);
                    worst = std::max(
                        worst, std::fabs(c(r, j) - want) / (magnitude(r, j) + std::fabs(c0(r, j))));
                  }
                  for (Eigen::Index j = n; j < c.cols(); ++j) {
                    ASSERT_EQ(c(r, j), c0(r, j)) << "wrote past the output's columns";
                  }
                }
                EXPECT_LE(worst, 1e-5)
                    << (b16 ? "bf16 " + ref::bf16_path(be).describe() : std::string("fp32"))
                    << " on " << ref::backend_name(be) << ", held by oneDNN " << L.held_by_onednn()
                    << ", " << m << " rows, " << threads << " threads, transposed " << transposed
                    << ", accumulate " << accumulate;
              }
            });
          }
        }
      }
    }
  }
}

// A bf16 model holds its projections at 2 bytes a weight (counted from the config here; plain,
// and in oneDNN's padded layout at most a tenth more), and the memory a prefill reports is what
// the estimate from shapes said, for both weight types, both layouts, on every backend.
TEST(Reference, Bf16ModelHoldsHalfItsProjectionsAndEstimatesItsMemory) {
  std::mt19937_64 rng(32);
  const ref::config c = random_config(rng);
  const std::uint64_t seed = rng();
  const double h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), f = c.ffn;
  const double projections = c.n_layers * (h * (q + 2 * kv) + q * h + 3 * h * f);
  EXPECT_EQ(ref::weight_bytes(c) - ref::weight_bytes(c, ref::weight_type::bf16), 2 * projections);
  const std::vector<int> len{60, 3, 17, 41};
  const auto prompts = random_prompts(rng, len, c.vocab);
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(len), prompts);
  for (ref::gemm_backend layout : backends()) {
    const ref::model f32(c, seed, {ref::weight_type::f32, layout});
    const ref::model bf16(c, seed, {ref::weight_type::bf16, layout});
    const double saved = static_cast<double>(f32.weight_bytes() - bf16.weight_bytes());
    if (layout == ref::gemm_backend::eigen) {
      EXPECT_EQ(saved, 2 * projections);
    } else {
      EXPECT_GE(saved, 1.8 * projections) << "oneDNN's layout";
    }
    for (const ref::model* m : {&f32, &bf16}) {
      for (ref::gemm_backend be : backends()) {
        for (const int threads : {1, 2}) {
          const auto est = m->estimate_memory(l.n_rows(), l.width(), l.n_prompts(), 60,
                                              ref::attention::segment, threads, be);
          const auto got = m->prefill(l, {ref::attention::segment, threads, be}).memory;
          const std::string what = std::string(m == &bf16 ? "bf16 " : "fp32 ") + "laid out for " +
                                   ref::backend_name(layout) + " on " + ref::backend_name(be);
          EXPECT_EQ(est.activation_bytes, got.activation_bytes) << what;
          EXPECT_EQ(est.peak_bytes, got.peak_bytes) << what;
        }
      }
    }
  }
}

TEST(Reference, DenseAndSegmentPathsAgreeAndThreadCountDoesNotMatter) {
  std::mt19937_64 rng(3);
  const ref::config c = random_config(rng);
  const ref::model m(c, 9);
  const auto prompts = random_prompts(rng, test::heavy_tailed_lengths(rng, 40, 250), c.vocab);
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(lengths_of(prompts)), prompts,
                                      {c.pad_id, 0});
  const auto a = m.prefill(l, {ref::attention::dense, 1});
  const auto b = m.prefill(l, {ref::attention::segment, 2});
  double dk = 0;
  for (std::size_t s = 0; s < l.n_slots(); ++s) {
    if (l.segments()[s] < 0) continue;  // pad slots differ legitimately (nothing reads them)
    const std::size_t per = static_cast<std::size_t>(c.kv_dim());
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const std::size_t base = (static_cast<std::size_t>(layer) * l.n_slots() + s) * per;
      for (std::size_t e = 0; e < per; ++e) {
        dk = std::max<double>(dk, std::abs(a.keys[base + e] - b.keys[base + e]));
        dk = std::max<double>(dk, std::abs(a.values[base + e] - b.values[base + e]));
      }
    }
  }
  const double dl = (a.logits - b.logits).cwiseAbs().maxCoeff();
  std::printf("dense (1 thread) vs segment (2 threads): max abs diff KV %.3g, logits %.3g\n", dk,
              dl);
  EXPECT_LE(dk, kTolerance);
  EXPECT_LE(dl, kTolerance);
  EXPECT_EQ(a.profile.n_threads, 1);
  EXPECT_EQ(b.profile.n_threads, 2);
}

// A row's norm scale and SwiGLU are one function of its values, wherever the row lies: the same
// token sits at other addresses in another row of a pass, or after the workspace grew, and must
// give the same bits there. Each is also checked against the same computation in double.
TEST(Reference, RowOperationsGiveOneResultWhereverTheRowLies) {
  std::mt19937_64 rng(12);
  std::normal_distribution<float> value(0.0f, 3.0f);
  const float eps = 1e-5f;
  for (const std::size_t n : {1u, 5u, 16u, 37u, 100u, 576u}) {
    std::vector<float> x(n), u(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = value(rng), u[i] = value(rng);
    double squares = 0;
    for (float v : x) squares += static_cast<double>(v) * v;
    const double scale = 1.0 / std::sqrt(squares / static_cast<double>(n) + eps);
    // A buffer's base is 4-byte aligned at least: 16 offsets of a float meet every position a
    // 64-byte vector register can start at.
    std::vector<float> buf(2 * n + 16), first_g;
    float first_s = 0;
    for (std::size_t off = 0; off < 16; ++off) {
      float* g = buf.data() + off;
      std::copy(x.begin(), x.end(), g);
      std::copy(u.begin(), u.end(), g + n);
      const float s = ref::detail::rms_scale(g, n, eps);
      ref::detail::swiglu(g, g + n, s, n);
      if (off == 0) {
        EXPECT_NEAR(s, scale, 1e-6 * scale) << "n " << n;
        for (std::size_t i = 0; i < n; ++i) {
          const double a = static_cast<double>(x[i]) * s, b = static_cast<double>(u[i]) * s;
          const double want = a / (1.0 + std::exp(-a)) * b;
          EXPECT_NEAR(g[i], want, 1e-5 * std::max(1.0, std::abs(want))) << "n " << n << " i " << i;
        }
        first_s = s;
        first_g.assign(g, g + n);
        continue;
      }
      ASSERT_EQ(s, first_s) << "n " << n << ": the norm scale moved with the row's offset " << off;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(g[i], first_g[i])
            << "n " << n << " value " << i << ": SwiGLU moved with offset " << off;
      }
    }
  }
}

// A model keeps its workspace between passes, and its buffers grow and move: a pass gives the
// same bits after a larger one as it did first, and as a copy of the model (a workspace of its
// own) gives. fp32 and held quantized weights, the latter with 8-bit activations too (a last-bit
// change there can move an activation across a rounding step and part the greedy tokens).
TEST(Reference, APassGivesTheSameBitsAfterLargerPasses) {
  std::mt19937_64 rng(21);
  for (int kind = 0; kind < 3; ++kind) {
    ref::config c = random_config(rng);
    if (kind == 2) c = test::whole_blocks(c);
    const std::uint64_t seed = rng();
    const ref::model m = kind == 0 ? ref::model(c, seed) : test::held_model(c, seed, kind == 2);
    const auto prompts = random_prompts(rng, {3, 17, 40, 9}, c.vocab);
    const int new_tokens = 6;
    const ref::prefill_options o{ref::attention::segment, 1};
    const auto run = [&](const ref::model& on) {
      auto [cache, logits] = ref::prefill_alone(on, prompts, new_tokens, o);
      auto d = ref::greedy_decode(on, cache, logits, new_tokens, {1});
      return std::make_tuple(std::move(cache), std::move(logits), std::move(d));
    };
    const auto [cache0, logits0, tokens0] = run(m);
    // Grow every buffer: a dense pass of 8 prompts of 300 tokens.
    const std::vector<std::vector<int>> big(8, std::vector<int>(300, 1));
    const auto l =
        prepack::make_layout(prepack::first_fit_decreasing(lengths_of(big)), big, {c.pad_id, 0});
    (void)m.prefill(l, {ref::attention::dense, 2});
    const auto [cache1, logits1, tokens1] = run(m);
    const ref::model copy = m;
    const auto [cache2, logits2, tokens2] = run(copy);
    const diff after = compare(cache0, logits0, cache1, logits1);
    const diff copied = compare(cache0, logits0, cache2, logits2);
    EXPECT_EQ(after.kv, 0.0) << "kind " << kind;
    EXPECT_EQ(after.logits, 0.0) << "kind " << kind;
    EXPECT_EQ(copied.kv, 0.0) << "kind " << kind;
    EXPECT_EQ(copied.logits, 0.0) << "kind " << kind;
    EXPECT_EQ(tokens0.tokens, tokens1.tokens) << "kind " << kind;
    EXPECT_EQ(tokens0.tokens, tokens2.tokens) << "kind " << kind;
    if (kind == 2) {
      EXPECT_TRUE(m.int8_activations());
    }
  }
}

TEST(Reference, EngineFacingMaskedPrefillMatchesLayoutPrefill) {
  // An engine that only knows input ids, position ids and a 4D additive mask gets the same
  // results from prepack's arrays as the layout-aware prefill.
  std::mt19937_64 rng(5);
  const ref::config c = random_config(rng);
  const ref::model m(c, 3);
  const auto prompts = random_prompts(rng, test::heavy_tailed_lengths(rng, 20, 120), c.vocab);
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(lengths_of(prompts)), prompts,
                                      {c.pad_id, 1});
  const auto mask = prepack::additive_mask(l);
  const auto a = m.prefill_masked(l.n_rows(), l.width(), l.tokens(), l.positions(),
                                  prepack::span<const float>(mask), l.last_token());
  const auto b = m.prefill(l, {ref::attention::segment, 0});
  const auto ca = ref::unpack_caches(m, l, a), cb = ref::unpack_caches(m, l, b);
  const diff d = compare(ca, a.logits, cb, b.logits);
  std::printf("prefill_masked vs prefill: max abs diff KV %.3g, logits %.3g\n", d.kv, d.logits);
  EXPECT_LE(d.kv, kTolerance);
  EXPECT_LE(d.logits, kTolerance);
  const std::vector<int> bad_out{static_cast<int>(l.n_slots())};
  EXPECT_PREPACK_ERROR(
      m.prefill_masked(l.n_rows(), l.width(), l.tokens(), l.positions(),
                       prepack::span<const float>(mask), prepack::span<const int>(bad_out)),
      "output slot 0");
  EXPECT_PREPACK_ERROR(m.prefill_masked(l.n_rows() + 1, l.width(), l.tokens(), l.positions(),
                                        prepack::span<const float>(mask), l.last_token()),
                       "tokens: ");
}

// A layer of `k` inputs whose rows are random blocks of Q8_0, Q4_0, Q4_1, Q4_K and Q6_K (a fused
// layer's segments, in that order), and each row's values computed here in double from the bytes
// by ggml's definitions (dequantize_row_q8_0: d q; q4_0: d (q - 8); q4_1: d q + m; q4_K:
// d sc q - dmin m with get_scale_min_k4's 6-bit scales and mins, low nibbles then high ones per
// 64 values; q6_K: d sc (ql | qh << 4 - 32), 16-value groups of int8 scales; with `q5k` also
// Q5_K rows, q5_K: Q4_K's values plus 16 where bit j of qh[l] is set; with `q3k` then Q3_K rows,
// q3_K: d (sc - 32) (2 bits - 4 where the high bit is clear), 16-value groups of 6-bit scales;
// with `more` then IQ4_NL, IQ4_XS (iq4_nl: d kvalues_iq4nl[q]; iq4_xs: d (ls - 32) of each 32
// values), Q5_0 and Q5_1 rows (q5_0: d ((q | bit j of qh << 4) - 16); q5_1: d q + m)), with the
// part of each value that is an offset rather than a multiple of q.
struct quantized_layer_case {
  std::vector<ref::quantized_matrix> segs;
  std::vector<std::vector<double>> w;       // [row][k]
  std::vector<std::vector<double>> offset;  // [row][k]  the part of w not scaled by q: Q4_1's
                                            // and Q5_1's m, Q4_K's -dmin m (0 for the others)
};
quantized_layer_case random_quantized_layer(std::mt19937& rng, Eigen::Index k, bool q5k = false,
                                            bool q3k = false, bool more = false) {
  using prepack::ggml::ggml_type;
  // the K-quants' 256-value blocks only where k holds them
  const bool k_quants = k % 256 == 0;
  const Eigen::Index rows8 = 7, rows4 = 6, rowsk = k_quants ? 5 : 0, rows6 = k_quants ? 4 : 0,
                     rows1 = 3, rows5 = k_quants && q5k ? 5 : 0, rows3 = k_quants && q3k ? 5 : 0,
                     rowsn = more ? 3 : 0, rowsx = k_quants && more ? 4 : 0, rows50 = more ? 3 : 0,
                     rows51 = more ? 3 : 0;
  const auto fp16 = [&](unsigned char* at, float v) {
    const std::uint16_t h = prepack::half::from_float(v);
    at[0] = static_cast<unsigned char>(h & 0xFF);
    at[1] = static_cast<unsigned char>(h >> 8);
  };
  const auto blocks = [&](ggml_type t, Eigen::Index rows) {
    const std::size_t bytes = t == ggml_type::q8_0     ? 34
                              : t == ggml_type::q4_0   ? 18
                              : t == ggml_type::q4_1   ? 20
                              : t == ggml_type::q4_k   ? 144
                              : t == ggml_type::q5_k   ? 176
                              : t == ggml_type::q3_k   ? 110
                              : t == ggml_type::iq4_nl ? 18
                              : t == ggml_type::iq4_xs ? 136
                              : t == ggml_type::q5_0   ? 22
                              : t == ggml_type::q5_1   ? 24
                                                       : 210;
    const Eigen::Index values = t == ggml_type::q4_k || t == ggml_type::q5_k ||
                                        t == ggml_type::q6_k || t == ggml_type::q3_k ||
                                        t == ggml_type::iq4_xs
                                    ? 256
                                    : 32;
    std::vector<unsigned char> b(static_cast<std::size_t>(rows * k / values) * bytes);
    for (std::size_t i = 0; i < b.size(); i += bytes) {
      for (std::size_t j = 0; j < bytes; ++j) b[i + j] = static_cast<unsigned char>(rng());
      const float d = 0.01f * static_cast<float>(1 + rng() % 50) * (rng() % 2 ? 1.0f : -1.0f);
      if (t == ggml_type::q6_k) {
        fp16(&b[i + 208], d / 64);  // d last; the int8 scales stay random
      } else if (t == ggml_type::q3_k) {
        fp16(&b[i + 108], d / 32);  // d last; the 6-bit scales stay random
      } else {
        fp16(&b[i], t == ggml_type::q4_k || t == ggml_type::q5_k ? d / 64 : d);
      }
      if (t == ggml_type::q4_k || t == ggml_type::q5_k) {
        fp16(&b[i + 2], 0.002f * static_cast<float>(rng() % 8));
      }
      if (t == ggml_type::q4_1 || t == ggml_type::q5_1) {
        fp16(&b[i + 2], 0.05f * static_cast<float>(rng() % 9) - 0.2f);
      }
    }
    return b;
  };
  const auto b8 = blocks(ggml_type::q8_0, rows8), b4 = blocks(ggml_type::q4_0, rows4),
             bk = blocks(ggml_type::q4_k, rowsk), b6 = blocks(ggml_type::q6_k, rows6),
             b1 = blocks(ggml_type::q4_1, rows1), b5 = blocks(ggml_type::q5_k, rows5),
             b3 = blocks(ggml_type::q3_k, rows3), bn = blocks(ggml_type::iq4_nl, rowsn),
             bx = blocks(ggml_type::iq4_xs, rowsx), b50 = blocks(ggml_type::q5_0, rows50),
             b51 = blocks(ggml_type::q5_1, rows51);
  // The rows' values by the definitions, in double.
  std::vector<std::vector<double>> w, offsets;
  for (Eigen::Index r = 0; r < rows8; ++r) {
    std::vector<double> off;
    std::vector<double> row;
    for (Eigen::Index b = 0; b < k / 32; ++b) {
      const unsigned char* p = b8.data() + static_cast<std::size_t>(r * k / 32 + b) * 34;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      for (int j = 0; j < 32; ++j) row.push_back(d * static_cast<std::int8_t>(p[2 + j]));
    }
    w.push_back(row);
    offsets.push_back(off.empty() ? std::vector<double>(static_cast<std::size_t>(k)) : off);
  }
  for (Eigen::Index r = 0; r < rows4; ++r) {
    std::vector<double> off;
    std::vector<double> row(static_cast<std::size_t>(k));
    for (Eigen::Index b = 0; b < k / 32; ++b) {
      const unsigned char* p = b4.data() + static_cast<std::size_t>(r * k / 32 + b) * 18;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      for (int j = 0; j < 16; ++j) {
        row[static_cast<std::size_t>(b * 32 + j)] = d * ((p[2 + j] & 0x0F) - 8);
        row[static_cast<std::size_t>(b * 32 + j + 16)] = d * ((p[2 + j] >> 4) - 8);
      }
    }
    w.push_back(row);
    offsets.push_back(off.empty() ? std::vector<double>(static_cast<std::size_t>(k)) : off);
  }
  for (Eigen::Index r = 0; r < rows1; ++r) {  // dequantize_row_q4_1: d q + m
    std::vector<double> off;
    std::vector<double> row(static_cast<std::size_t>(k));
    for (Eigen::Index b = 0; b < k / 32; ++b) {
      const unsigned char* p = b1.data() + static_cast<std::size_t>(r * k / 32 + b) * 20;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      const double m = prepack::half::to_float(static_cast<std::uint16_t>(p[2] | (p[3] << 8)));
      off.resize(static_cast<std::size_t>(k));
      for (int j = 0; j < 16; ++j) {
        row[static_cast<std::size_t>(b * 32 + j)] = d * (p[4 + j] & 0x0F) + m;
        row[static_cast<std::size_t>(b * 32 + j + 16)] = d * (p[4 + j] >> 4) + m;
        off[static_cast<std::size_t>(b * 32 + j)] = off[static_cast<std::size_t>(b * 32 + j + 16)] =
            m;
      }
    }
    w.push_back(row);
    offsets.push_back(off.empty() ? std::vector<double>(static_cast<std::size_t>(k)) : off);
  }
  const auto scale_min = [](int j, const unsigned char* q, int& sc, int& mn) {  // get_scale_min_k4
    if (j < 4) {
      sc = q[j] & 63;
      mn = q[j + 4] & 63;
    } else {
      sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
      mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
  };
  for (Eigen::Index r = 0; r < rowsk; ++r) {
    std::vector<double> off;
    std::vector<double> row;
    for (Eigen::Index b = 0; b < k / 256; ++b) {
      const unsigned char* p = bk.data() + static_cast<std::size_t>(r * k / 256 + b) * 144;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      const double dmin = prepack::half::to_float(static_cast<std::uint16_t>(p[2] | (p[3] << 8)));
      for (int c = 0; c < 4; ++c) {
        int s1, m1, s2, m2;
        scale_min(2 * c, p + 4, s1, m1);
        scale_min(2 * c + 1, p + 4, s2, m2);
        const unsigned char* q = p + 16 + 32 * c;
        for (int l = 0; l < 32; ++l) row.push_back(d * s1 * (q[l] & 0xF) - dmin * m1);
        for (int l = 0; l < 32; ++l) row.push_back(d * s2 * (q[l] >> 4) - dmin * m2);
        off.insert(off.end(), 32, -dmin * m1);
        off.insert(off.end(), 32, -dmin * m2);
      }
    }
    w.push_back(row);
    offsets.push_back(off.empty() ? std::vector<double>(static_cast<std::size_t>(k)) : off);
  }
  for (Eigen::Index r = 0; r < rows6; ++r) {  // dequantize_row_q6_K
    std::vector<double> off;
    std::vector<double> row(static_cast<std::size_t>(k));
    for (Eigen::Index b = 0; b < k / 256; ++b) {
      const unsigned char* p = b6.data() + static_cast<std::size_t>(r * k / 256 + b) * 210;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[208] | (p[209] << 8)));
      for (int n = 0; n < 2; ++n) {
        const unsigned char* ql = p + 64 * n;
        const unsigned char* qh = p + 128 + 32 * n;
        const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192 + 8 * n);
        double* y = row.data() + b * 256 + 128 * n;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          y[l] = d * sc[is] * (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
          y[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
          y[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          y[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
      }
    }
    w.push_back(row);
    offsets.push_back(off.empty() ? std::vector<double>(static_cast<std::size_t>(k)) : off);
  }
  for (Eigen::Index r = 0; r < rows5; ++r) {  // dequantize_row_q5_K
    std::vector<double> off;
    std::vector<double> row;
    for (Eigen::Index b = 0; b < k / 256; ++b) {
      const unsigned char* p = b5.data() + static_cast<std::size_t>(r * k / 256 + b) * 176;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      const double dmin = prepack::half::to_float(static_cast<std::uint16_t>(p[2] | (p[3] << 8)));
      const unsigned char* qh = p + 16;
      for (int c = 0; c < 4; ++c) {
        int s1, m1, s2, m2;
        scale_min(2 * c, p + 4, s1, m1);
        scale_min(2 * c + 1, p + 4, s2, m2);
        const unsigned char* q = p + 48 + 32 * c;
        const int u1 = 1 << (2 * c), u2 = 2 << (2 * c);
        for (int l = 0; l < 32; ++l) {
          row.push_back(d * s1 * ((q[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - dmin * m1);
        }
        for (int l = 0; l < 32; ++l) {
          row.push_back(d * s2 * ((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - dmin * m2);
        }
        off.insert(off.end(), 32, -dmin * m1);
        off.insert(off.end(), 32, -dmin * m2);
      }
    }
    w.push_back(row);
    offsets.push_back(off);
  }
  for (Eigen::Index r = 0; r < rows3; ++r) {  // dequantize_row_q3_K
    std::vector<double> row;
    for (Eigen::Index b = 0; b < k / 256; ++b) {
      const unsigned char* p = b3.data() + static_cast<std::size_t>(r * k / 256 + b) * 110;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[108] | (p[109] << 8)));
      const unsigned char* hm = p;
      const unsigned char* sp = p + 96;
      int sc[16];  // scale j: low 4 bits from byte j % 8 (j < 8 low nibble, else high), high 2
                   // bits from byte 8 + j % 4, bits 2 (j / 4) and up
      for (int j = 0; j < 16; ++j) {
        const int lo = j < 8 ? sp[j] & 0xF : sp[j - 8] >> 4;
        sc[j] = (lo | (((sp[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
      }
      for (int n = 0; n < 2; ++n) {
        const unsigned char* q = p + 32 + 32 * n;
        for (int j = 0; j < 4; ++j) {
          for (int half = 0; half < 2; ++half) {
            const int g = 8 * n + 2 * j + half;
            for (int l = 0; l < 16; ++l) {
              const int v = ((q[16 * half + l] >> (2 * j)) & 3) -
                            ((hm[16 * half + l] >> (4 * n + j)) & 1 ? 0 : 4);
              row.push_back(d * sc[g] * v);
            }
          }
        }
      }
    }
    w.push_back(row);
    offsets.emplace_back(static_cast<std::size_t>(k));
  }
  // dequantize_row_iq4_nl / _iq4_xs: d kvalues_iq4nl[q], IQ4_XS's d times a 6-bit scale - 32
  // per 32 values (low 4 bits in scales_l's nibbles, high 2 in scales_h's bit pairs)
  const int kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                           1,    13,   25,  38,  53,  69,  89,  113};
  for (Eigen::Index r = 0; r < rowsn + rowsx; ++r) {
    const bool xs = r >= rowsn;
    std::vector<double> row;
    for (Eigen::Index b = 0; b < k / 32; ++b) {
      const unsigned char* p =
          xs ? bx.data() + static_cast<std::size_t>((r - rowsn) * k / 256 + b / 8) * 136
             : bn.data() + static_cast<std::size_t>(r * k / 32 + b) * 18;
      double d = prepack::half::to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      const unsigned char* q = p + 2;
      if (xs) {
        const int ib = static_cast<int>(b % 8);
        const int high = ((p[2] | (p[3] << 8)) >> (2 * ib)) & 3;
        const int low = (p[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
        d *= (low | (high << 4)) - 32;
        q = p + 8 + 16 * ib;
      }
      for (int l = 0; l < 16; ++l) row.push_back(d * kvalues[q[l] & 0xF]);
      for (int l = 0; l < 16; ++l) row.push_back(d * kvalues[q[l] >> 4]);
    }
    w.push_back(row);
    offsets.emplace_back(static_cast<std::size_t>(k));
  }
  // dequantize_row_q5_0 / _q5_1: (nibble | bit j of the 32-bit qh as 16 on value j) - 16, times
  // d; Q5_1 d q + m
  for (Eigen::Index r = 0; r < rows50 + rows51; ++r) {
    const bool q51 = r >= rows50;
    std::vector<double> row, off;
    for (Eigen::Index b = 0; b < k / 32; ++b) {
      const unsigned char* p =
          q51 ? b51.data() + static_cast<std::size_t>((r - rows50) * k / 32 + b) * 24
              : b50.data() + static_cast<std::size_t>(r * k / 32 + b) * 22;
      const double d = prepack::half::to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      const double m =
          q51 ? prepack::half::to_float(static_cast<std::uint16_t>(p[2] | (p[3] << 8))) : 0.0;
      const unsigned char* qh = p + (q51 ? 4 : 2);
      const unsigned char* qs = p + (q51 ? 8 : 6);
      for (int j = 0; j < 32; ++j) {
        const int nibble = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
        const int high = (qh[j / 8] >> (j % 8)) & 1;
        row.push_back(d * ((nibble | (high << 4)) - (q51 ? 0 : 16)) + m);
        off.push_back(m);
      }
    }
    w.push_back(row);
    offsets.push_back(off);
  }
  std::vector<ref::quantized_matrix> segs;
  segs.push_back(
      ref::quantized_matrix::from_bytes(ggml_type::q8_0, rows8, k, b8.data(), b8.size(), "q8"));
  segs.push_back(
      ref::quantized_matrix::from_bytes(ggml_type::q4_0, rows4, k, b4.data(), b4.size(), "q4"));
  segs.push_back(
      ref::quantized_matrix::from_bytes(ggml_type::q4_1, rows1, k, b1.data(), b1.size(), "q41"));
  if (k_quants) {
    segs.push_back(
        ref::quantized_matrix::from_bytes(ggml_type::q4_k, rowsk, k, bk.data(), bk.size(), "q4k"));
    segs.push_back(
        ref::quantized_matrix::from_bytes(ggml_type::q6_k, rows6, k, b6.data(), b6.size(), "q6k"));
  }
  if (rows5 > 0) {
    segs.push_back(
        ref::quantized_matrix::from_bytes(ggml_type::q5_k, rows5, k, b5.data(), b5.size(), "q5k"));
  }
  if (rows3 > 0) {
    segs.push_back(
        ref::quantized_matrix::from_bytes(ggml_type::q3_k, rows3, k, b3.data(), b3.size(), "q3k"));
  }
  if (rowsn > 0) {
    segs.push_back(ref::quantized_matrix::from_bytes(ggml_type::iq4_nl, rowsn, k, bn.data(),
                                                     bn.size(), "iq4nl"));
  }
  if (rowsx > 0) {
    segs.push_back(ref::quantized_matrix::from_bytes(ggml_type::iq4_xs, rowsx, k, bx.data(),
                                                     bx.size(), "iq4xs"));
  }
  if (rows50 > 0) {
    segs.push_back(ref::quantized_matrix::from_bytes(ggml_type::q5_0, rows50, k, b50.data(),
                                                     b50.size(), "q50"));
    segs.push_back(ref::quantized_matrix::from_bytes(ggml_type::q5_1, rows51, k, b51.data(),
                                                     b51.size(), "q51"));
  }
  return {std::move(segs), std::move(w), std::move(offsets)};
}

// A layer of Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, Q5_K, Q3_K, IQ4_NL, IQ4_XS, Q5_0 and Q5_1 rows
// (random_quantized_layer) multiplies
// like the values its blocks define; at 1 to 8 rows (where AVX2 / AVX-512 builds dot straight from
// the blocks, four rows a pass: 5 and 8 take two; Q5_K and Q3_K on AVX-512 only) and at 9, 17
// and 40 (decoded rows times the transposed input in tiles of one and two vectors of columns, 40
// padded to whole tiles, 512 inputs in two passes; the panel GEMMs on SSE-only builds), with and
// without accumulating, on 1 and 2 threads.
TEST(Reference, QuantizedRowsMultiplyAsTheirBlocksDefine) {
  std::mt19937 rng(23);
  const Eigen::Index k = 512;
  quantized_layer_case lc = random_quantized_layer(rng, k, true, true, true);
  const std::vector<std::vector<double>>& w = lc.w;
  const Eigen::Index n = static_cast<Eigen::Index>(w.size());
  const ref::linear layer(std::move(lc.segs), ref::vector());
  test::for_threads({1, 2}, [&](int threads) {
    for (const Eigen::Index m : {1, 2, 3, 4, 5, 8, 9, 17, 40}) {
      std::vector<float> a(static_cast<std::size_t>(m * k));
      for (auto& v : a) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.0f;
      for (const bool accumulate : {false, true}) {
        std::vector<float> c(static_cast<std::size_t>(m * n), accumulate ? 0.5f : -7.0f);
        ref::gemm_scratch scratch;
        layer.apply(ref::gemm_backend::eigen, m, a.data(), k, c.data(), n, accumulate, scratch);
        for (Eigen::Index i = 0; i < m; ++i) {
          for (Eigen::Index j = 0; j < n; ++j) {
            double want = accumulate ? 0.5 : 0.0, scale = 0.0;
            for (Eigen::Index t = 0; t < k; ++t) {
              const double term = a[static_cast<std::size_t>(i * k + t)] *
                                  w[static_cast<std::size_t>(j)][static_cast<std::size_t>(t)];
              want += term;
              scale += std::abs(term);
            }
            EXPECT_NEAR(c[static_cast<std::size_t>(i * n + j)], want, 1e-6 * scale + 1e-6)
                << "m " << m << " row " << j << " of " << i << " threads " << threads
                << " accumulate " << accumulate;
          }
        }
      }
    }
  });
}

// With 8-bit activations (linear's int8_activations), each output is within the stated bound of
// the exact dot with the values the blocks define: |y - w . a| <= sum_b d_b / 2 sum_{i in b}
// |w_i - o_i| (d_b = max |a| / 127 over the activation block b, computed here; o_i the value's
// offset, Q4_1's m and Q4_K's -dmin m, which multiply the exact activations), plus fp32
// rounding; it equals that dot with the activations quantized as stated (q = a / d_b to
// nearest, ties to even; evaluated here in double from those q); and a row's result is
// the same bits whatever rows multiply beside it (every row of 1 to 70, tiles of 64 and the
// converted weight rows' path from 20 rows crossed), so packing
// keeps every request equal to running it alone. Rows of 512 values (all eleven types) and of
// 17 32-value blocks (Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1: the kernels' steps of four and two
// blocks, then an odd last one).
void int8_dots_within_their_bound(Eigen::Index k) {
  std::mt19937 rng(29);
  quantized_layer_case lc = random_quantized_layer(rng, k, true, true, true);
  const std::vector<std::vector<double>>& w = lc.w;
  const std::vector<std::vector<double>>& offset = lc.offset;
  const Eigen::Index n = static_cast<Eigen::Index>(w.size());
  const ref::linear layer(std::move(lc.segs), ref::vector(), true);
  ASSERT_TRUE(layer.int8_activations());
  const ref::linear exact(layer.quantized_segments(), ref::vector());
  EXPECT_FALSE(exact.int8_activations());
  const Eigen::Index most = 70;
  std::vector<float> a(static_cast<std::size_t>(most * k));
  for (auto& v : a) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.0f;
  for (Eigen::Index b = 0; b < k / 32; b += 5) a[static_cast<std::size_t>(b * 32 + 7)] = 0.0f;
  std::fill(a.begin() + 64, a.begin() + 96, 0.0f);  // an all-zero block (d_b = 0)
  // Each row alone, the reference bits for every batch size.
  std::vector<float> alone(static_cast<std::size_t>(most * n));
  for (Eigen::Index i = 0; i < most; ++i) {
    ref::gemm_scratch scratch;
    layer.apply(ref::gemm_backend::eigen, 1, a.data() + i * k, k, alone.data() + i * n, n, false,
                scratch);
  }
  test::for_threads({1, 2}, [&](int threads) {
    for (const Eigen::Index m : {1, 2, 3, 4, 5, 9, 17, 24, 70}) {
      for (const bool accumulate : {false, true}) {
        std::vector<float> c(static_cast<std::size_t>(m * n), accumulate ? 0.5f : -7.0f);
        ref::gemm_scratch scratch;
        layer.apply(ref::gemm_backend::eigen, m, a.data(), k, c.data(), n, accumulate, scratch);
        for (Eigen::Index i = 0; i < m; ++i) {
          const float* x = a.data() + i * k;
          std::vector<double> dq(static_cast<std::size_t>(k));  // d_b q, as stated
          std::vector<double> half_step(static_cast<std::size_t>(k / 32));
          for (Eigen::Index b = 0; b < k / 32; ++b) {
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[b * 32 + j]));
            const float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
            half_step[static_cast<std::size_t>(b)] = db / 2.0;
            for (int j = 0; j < 32; ++j) {
              dq[static_cast<std::size_t>(b * 32 + j)] =
                  static_cast<double>(db) * std::nearbyint(x[b * 32 + j] * id);
            }
          }
          for (Eigen::Index j = 0; j < n; ++j) {
            const std::vector<double>& row = w[static_cast<std::size_t>(j)];
            const std::vector<double>& o = offset[static_cast<std::size_t>(j)];
            double exact_dot = 0, quant_dot = 0, bound = 0, scale = 0;
            for (Eigen::Index t = 0; t < k; ++t) {
              const auto u = static_cast<std::size_t>(t);
              const double scaled = row[u] - o[u];  // multiplies q; the offset, a's exact sum
              exact_dot += row[u] * x[t];
              quant_dot += scaled * dq[u] + o[u] * x[t];
              bound += std::abs(scaled) * half_step[static_cast<std::size_t>(t / 32)];
              scale += std::abs(row[u] * x[t]) + std::abs(scaled * x[t]);
            }
            const double got = c[static_cast<std::size_t>(i * n + j)] - (accumulate ? 0.5 : 0.0);
            const std::string where = "m " + std::to_string(m) + " row " + std::to_string(j) +
                                      " of " + std::to_string(i) + " threads " +
                                      std::to_string(threads);
            EXPECT_NEAR(got, quant_dot, 2e-6 * scale + 1e-6) << where;
            EXPECT_LE(std::abs(got - exact_dot), bound + 2e-6 * scale + 1e-6) << where;
            if (!accumulate) {
              EXPECT_EQ(c[static_cast<std::size_t>(i * n + j)],
                        alone[static_cast<std::size_t>(i * n + j)])
                  << where;
            }
          }
        }
      }
    }
  });
  // The mode is not the exact path: on these rows some output differs from it.
  std::vector<float> c8(static_cast<std::size_t>(n)), c32(static_cast<std::size_t>(n));
  ref::gemm_scratch scratch;
  layer.apply(ref::gemm_backend::eigen, 1, a.data(), k, c8.data(), n, false, scratch);
  exact.apply(ref::gemm_backend::eigen, 1, a.data(), k, c32.data(), n, false, scratch);
  EXPECT_NE(c8, c32);
}

TEST(Reference, Int8ActivationsDotWithinTheirBound) {
  for (const Eigen::Index k : {512, 544}) int8_dots_within_their_bound(k);
}

// Weights held quantized compute the function of their widened values: a model whose
// projections, embedding and LM head are Q8_0 rows (F32 rows where a width is not whole blocks)
// against an fp32 model of the values Q8_0 stores, computed here from the encoding's definition
// (d * q, d rounded to fp16), on every layout, backend and thread count; the model holds the
// blocks' bytes, not 4 a weight, and its memory estimate is what a prefill then allocates.
TEST(Reference, QuantizedProjectionsComputeTheirWidenedValues) {
  std::mt19937_64 rng(41);
  int q8 = 0;
  for (int trial = 0; trial < 4; ++trial) {
    ref::config c = random_config(rng);
    if (trial < 2) {  // whole Q8_0 blocks everywhere
      c.hidden = 64;
      c.n_heads = 4;
      c.n_kv_heads = 2;
      c.head_dim = 16;
      c.ffn = 96;
    }
    const std::uint64_t seed = rng();
    const ref::weights w = ref::random_weights(c, seed);
    ref::weights widened = w;
    const auto stored = [](ref::matrix& m) {  // [in][out]: blocks run along `in`
      if (m.rows() % 32 != 0) return;
      for (Eigen::Index o = 0; o < m.cols(); ++o) {
        for (Eigen::Index b = 0; b < m.rows(); b += 32) {
          float amax = 0;
          for (Eigen::Index k = 0; k < 32; ++k) amax = std::max(amax, std::abs(m(b + k, o)));
          const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
          const float dh = prepack::half::to_float(prepack::half::from_float(d));
          for (Eigen::Index k = 0; k < 32; ++k) m(b + k, o) = dh * std::round(m(b + k, o) * id);
        }
      }
    };
    for (ref::layer_weights& lw : widened.layers) {
      for (ref::matrix* m : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) {
        stored(*m);
      }
    }
    ref::matrix table = widened.embed.transpose();  // blocks run along hidden
    stored(table);
    widened.embed = table.transpose();
    stored(widened.lm_head);
    const auto prompts = random_prompts(rng, {37, 5, 61, 12}, c.vocab);
    const auto len = lengths_of(prompts);
    const auto l = prepack::make_layout(prepack::first_fit_decreasing(len), prompts);
    for (ref::gemm_backend layout : backends()) {
      test::held_source src(w);  // projections, embedding and LM head held
      const ref::model held(c, src, {ref::weight_type::f32, layout});
      const ref::model plain(c, widened, {ref::weight_type::f32, layout});
      ASSERT_TRUE(held.quantized());
      EXPECT_FALSE(plain.quantized());
      q8 += held.quantized_types().count("Q8_0") ? held.quantized_types().at("Q8_0") : 0;
      int matrices = 0;
      double bytes = 4.0 * (c.n_params() - c.projection_params() - c.embedding_params());
      for (const auto& [type, n] : held.quantized_types()) matrices += n;
      EXPECT_EQ(matrices, 7 * c.n_layers + (c.tied_embeddings ? 1 : 2));
      const auto q_bytes = [](double in, double out) {
        return static_cast<long long>(in) % 32 == 0 ? in / 32 * 34 * out : 4 * in * out;
      };
      const double h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), f = c.ffn;
      bytes += c.n_layers *
                   (q_bytes(h, q + 2 * kv) + q_bytes(q, h) + q_bytes(h, 2 * f) + q_bytes(f, h)) +
               (c.tied_embeddings ? 1 : 2) * q_bytes(h, c.vocab);
      EXPECT_EQ(static_cast<double>(held.weight_bytes()), bytes) << "trial " << trial;
      for (ref::gemm_backend be : backends()) {
        for (const int threads : {1, 2}) {
          const auto rh = held.prefill(l, {ref::attention::segment, threads, be});
          const auto rp = plain.prefill(l, {ref::attention::segment, threads, be});
          const double scale = std::max(1.0f, rp.logits.cwiseAbs().maxCoeff());
          const std::string where = "trial " + std::to_string(trial) + ", laid out for " +
                                    ref::backend_name(layout) + " on " + ref::backend_name(be) +
                                    ", " + std::to_string(threads) + " threads";
          EXPECT_LE((rh.logits - rp.logits).cwiseAbs().maxCoeff() / scale, 1e-5) << where;
          double kv_diff = 0;
          for (std::size_t i = 0; i < rh.keys.size(); ++i) {
            kv_diff = std::max<double>(kv_diff, std::abs(rh.keys[i] - rp.keys[i]));
            kv_diff = std::max<double>(kv_diff, std::abs(rh.values[i] - rp.values[i]));
          }
          EXPECT_LE(kv_diff, 1e-4) << where;
          const auto est = held.estimate_memory(l.n_rows(), l.width(), l.n_prompts(), 61,
                                                ref::attention::segment, threads, be);
          EXPECT_EQ(est.activation_bytes, rh.memory.activation_bytes) << where;
          EXPECT_EQ(est.peak_bytes, rh.memory.peak_bytes) << where;
        }
      }
      // Few rows (decode's panels) and many rows (prefill's) compute the same function.
      auto [cache, logits] = ref::prefill_alone(held, prompts, 3);
      auto [pc, pl] = ref::prefill_alone(plain, prompts, 3);
      const auto got = ref::greedy_decode(held, cache, logits, 3);
      const auto want = ref::greedy_decode(plain, pc, pl, 3);
      expect_same_tokens(want, got, "held against widened, decode");
    }
  }
  EXPECT_GT(q8, 0);
}

// Held-quantized weights refuse what they cannot hold or multiply, naming the item and value,
// before anything is built.
TEST(ReferenceErrors, QuantizedWeightsRefuseBadShapesAndBytes) {
  using prepack::ggml::ggml_type;
  const std::vector<unsigned char> block(34, 0);
  EXPECT_PREPACK_ERROR(ref::quantized_matrix::from_bytes(ggml_type::q8_0, 1, 40, block.data(), 34,
                                                         "blk.3.attn_q.weight"),
                       "blk.3.attn_q.weight: rows of 40 values are not a whole number of Q8_0's "
                       "32-value blocks");
  EXPECT_PREPACK_ERROR(ref::quantized_matrix::from_bytes(ggml_type::q8_0, 2, 32, block.data(), 34,
                                                         "blk.0.ffn_up.weight"),
                       "blk.0.ffn_up.weight: 34 bytes, expected 68 (2 rows of 34 bytes)");
  EXPECT_PREPACK_ERROR(
      ref::quantized_matrix::from_bytes(ggml_type::iq2_xs, 1, 256, block.data(), 34, "t"),
      "t: type IQ2_XS (17) cannot be decoded");
  EXPECT_PREPACK_ERROR(
      ref::quantized_matrix::from_bytes(ggml_type::q8_0, 0, 32, block.data(), 0, "t"),
      "t: shape 0 x 32");
  const auto q = ref::quantized_matrix::from_bytes(ggml_type::q8_0, 1, 32, block.data(), 34, "t");
  EXPECT_PREPACK_ERROR(q.permuted_rows({0, 1}), "permuted_rows: 2 indices for 1 rows");
  EXPECT_PREPACK_ERROR(q.permuted_rows({5}), "permuted_rows: index 0 = 5 outside 1 rows");
  const auto wide = ref::quantized_matrix::from_fp32(ref::matrix::Ones(64, 3));
  EXPECT_PREPACK_ERROR(ref::linear(std::vector<ref::quantized_matrix>{q, wide}, ref::vector()),
                       "linear: segment 1 (F32) is 3 x 64, the layer's rows are 32 wide");
  EXPECT_PREPACK_ERROR(ref::linear(std::vector<ref::quantized_matrix>{q}, ref::vector::Ones(31)),
                       "linear: input scale of 31 for 32 inputs");
  EXPECT_PREPACK_ERROR(ref::linear(std::vector<ref::quantized_matrix>{}, ref::vector()),
                       "linear: no quantized rows");
  // A layer handing a projection both ways, or quantized rows of another shape.
  ref::config c;
  auto both = ref::random_weights(c, 1);
  both.layers[1].quantized.wo = test::held_rows(both.layers[1].wo);
  EXPECT_PREPACK_ERROR(ref::model(c, both),
                       "weights: layers[1].wo (held quantized) is 128 x 128, expected 0 x 0");
  auto shape = test::held_quantized(ref::random_weights(c, 1));
  shape.layers[0].quantized.w_down = shape.layers[0].quantized.w_up;
  EXPECT_PREPACK_ERROR(ref::model(c, shape),
                       "weights: layers[0].w_down (Q8_0) is 256 x 128 rows, expected 128 x 256");
}

TEST(Reference, MemoryAccountingFollowsTheBuffers) {
  ref::config c;
  const ref::model m(c, 1);
  std::mt19937_64 rng(4);
  const std::vector<int> len{100, 3, 4, 5, 90, 7};
  const auto prompts = random_prompts(rng, len, c.vocab);
  const auto packed = prepack::make_layout(prepack::first_fit_decreasing(len), prompts);
  const auto padded = prepack::make_layout(prepack::padded(len), prompts);
  const auto rp = m.prefill(packed, {ref::attention::dense, 1});
  const auto rd = m.prefill(padded, {ref::attention::dense, 1});
  // 2 (K and V) * layers * slots * kv_dim floats: the result's own buffers.
  EXPECT_EQ(rp.memory.kv_bytes, (rp.keys.size() + rp.values.size()) * sizeof(float));
  EXPECT_EQ(rp.memory.kv_bytes, 2u * 2u * packed.n_slots() * 64u * 4u);
  EXPECT_EQ(rp.memory.mask_bytes, packed.n_rows() * 100u * 100u * 4u);
  EXPECT_EQ(rd.memory.mask_bytes, 6u * 100u * 100u * 4u);
  EXPECT_EQ(m.prefill(packed, {ref::attention::segment, 1}).memory.mask_bytes, 0u);
  EXPECT_LT(rp.memory.peak_bytes, rd.memory.peak_bytes);
  // The estimate from shapes alone is what the prefill then allocates.
  for (const auto* l : {&packed, &padded}) {
    for (auto path : {ref::attention::dense, ref::attention::segment}) {
      const auto est = m.estimate_memory(l->n_rows(), l->width(), l->n_prompts(), 100, path, 1);
      const auto got = m.prefill(*l, {path, 1}).memory;
      EXPECT_EQ(est.peak_bytes, got.peak_bytes);
      EXPECT_EQ(est.activation_bytes, got.activation_bytes);
      EXPECT_EQ(est.scratch_bytes, got.scratch_bytes);
    }
  }
  EXPECT_PREPACK_ERROR(
      m.estimate_memory(std::size_t{1} << 40, std::size_t{1} << 30, 1, 1, ref::attention::dense, 1),
      "overflows size_t");
  EXPECT_EQ(rp.memory.peak_bytes, rp.memory.kv_bytes + rp.memory.activation_bytes +
                                      rp.memory.mask_bytes + rp.memory.scratch_bytes);
}

TEST(ReferenceErrors, ConfigAndWeights) {
  ref::config c;
  c.n_heads = 6;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  EXPECT_PREPACK_ERROR(ref::model(c, 1), "config: n_heads 6 is not a multiple of n_kv_heads 4");
  ref::config d;
  d.hidden = 100;
  d.n_heads = 3;
  d.n_kv_heads = 1;
  EXPECT_PREPACK_ERROR(ref::model(d, 1), "config: hidden 100 is not a multiple of n_heads 3");
  ref::config e;
  e.pad_id = 512;
  EXPECT_PREPACK_ERROR(ref::model(e, 1), "config: pad_id 512 outside vocab 512");
  ref::config f;
  f.vocab = 0;
  EXPECT_PREPACK_ERROR(ref::random_weights(f, 1), "config: vocab 0");
  ref::config g;
  auto w = ref::random_weights(g, 1);
  w.layers[1].wq = ref::matrix::Zero(128, 32);
  EXPECT_PREPACK_ERROR(ref::model(g, w), "weights: layers[1].wq is 128 x 32, expected 128 x 128");
  auto w2 = ref::random_weights(g, 1);
  w2.layers.pop_back();
  EXPECT_PREPACK_ERROR(ref::model(g, w2), "weights: 1 layers, config has 2");
  ref::config biased = g;
  biased.qkv_bias = true;
  EXPECT_PREPACK_ERROR(ref::model(biased, ref::random_weights(g, 1)),
                       "weights: layers[0].bq has 0 entries, expected 128");
  ref::config tied = g;
  tied.tied_embeddings = true;
  EXPECT_PREPACK_ERROR(ref::model(tied, ref::random_weights(g, 1)), "lm_head (tied to embed)");
}

// A model built from a weight source (a piece at a time) is the model built from the same
// weights whole; a source is asked for each piece once, in order; a piece of the
// wrong shape is refused by name when it arrives.
class counting_source final : public ref::weight_source {
 public:
  counting_source(const ref::config& c, std::uint64_t seed) : inner_(c, seed) {}
  ref::matrix embed() override { return note("embed"), inner_.embed(); }
  ref::layer_weights layer(int l) override {
    note("layer" + std::to_string(l));
    auto lw = inner_.layer(l);
    if (l == bad_layer) lw.w_down = ref::matrix::Zero(3, 5);
    return lw;
  }
  ref::vector final_norm() override { return note("final_norm"), inner_.final_norm(); }
  ref::matrix lm_head() override { return note("lm_head"), inner_.lm_head(); }
  std::string calls;
  int bad_layer = -1;

 private:
  void note(const std::string& what) { calls += calls.empty() ? what : " " + what; }
  ref::random_source inner_;
};

TEST(Reference, ModelFromASourceEqualsModelFromWholeWeights) {
  std::mt19937_64 rng(33);
  for (int trial = 0; trial < 3; ++trial) {
    const ref::config c = random_config(rng);
    const std::uint64_t seed = rng();
    for (const ref::weight_type wt : {ref::weight_type::f32, ref::weight_type::bf16}) {
      counting_source src(c, seed);
      const ref::model streamed(c, src, {wt});
      std::string want = "embed";
      for (int l = 0; l < c.n_layers; ++l) want += " layer" + std::to_string(l);
      EXPECT_EQ(src.calls, want + " final_norm lm_head");
      const ref::model whole(c, ref::random_weights(c, seed), {wt}), seeded(c, seed, {wt});
      const auto prompts = random_prompts(rng, {9, 30, 2}, c.vocab);
      const auto l =
          prepack::make_layout(prepack::first_fit_decreasing(lengths_of(prompts)), prompts);
      const auto a = streamed.prefill(l, {ref::attention::segment, 1});
      const auto b = whole.prefill(l, {ref::attention::segment, 1});
      const auto s = seeded.prefill(l, {ref::attention::segment, 1});
      // Equal up to the GEMM library's own run-to-run spread between two copies of the same
      // weights at different addresses (it aligns its blocks to the pointer).
      const auto far = [](const ref::prefill_result& x, const ref::prefill_result& y) {
        double d = 0;
        for (std::size_t i = 0; i < x.keys.size(); ++i) {
          d = std::max<double>(d, std::fabs(x.keys[i] - y.keys[i]));
          d = std::max<double>(d, std::fabs(x.values[i] - y.values[i]));
        }
        const double scale = std::max(1.0f, y.logits.cwiseAbs().maxCoeff());
        return std::max<double>(d, (x.logits - y.logits).cwiseAbs().maxCoeff() / scale);
      };
      ASSERT_EQ(a.keys.size(), b.keys.size());
      EXPECT_LE(far(a, b), 1e-5) << ref::weight_type_name(wt);
      EXPECT_LE(far(s, b), 1e-5) << ref::weight_type_name(wt);
      EXPECT_EQ(streamed.weight_bytes(), whole.weight_bytes());
    }
  }
  ref::config c;
  counting_source bad(c, 1);
  bad.bad_layer = 1;
  EXPECT_PREPACK_ERROR(ref::model(c, bad), "weights: layers[1].w_down is 3 x 5, expected");
  EXPECT_EQ(bad.calls, "embed layer0 layer1") << "asked for pieces after the bad one";
}

TEST(ReferenceErrors, BadTokensAndForeignLayouts) {
  ref::config c;
  const ref::model m(c, 1);
  const std::vector<int> len{3, 2};
  auto l =
      prepack::make_layout(prepack::first_fit_decreasing(len), std::vector<int>{1, 2, 3, 4, 999});
  EXPECT_PREPACK_ERROR(m.prefill(l), "prompt 1: token 1 = 999 outside vocab 512");
  auto pad = prepack::make_layout(prepack::padded(len), std::vector<int>{1, 2, 3, 4, 5}, {-1, 0});
  EXPECT_PREPACK_ERROR(m.prefill(pad), "pad slot 3: token -1 outside vocab 512");
  const auto good =
      prepack::make_layout(prepack::first_fit_decreasing(len), std::vector<int>{1, 2, 3, 4, 5});
  const auto other = prepack::make_layout(prepack::padded(std::vector<int>{3, 2, 1}),
                                          std::vector<int>{1, 2, 3, 4, 5, 6});
  const auto r = m.prefill(good);
  EXPECT_PREPACK_ERROR(ref::unpack_caches(m, other, r), "another batch");
  EXPECT_PREPACK_ERROR(m.prefill(good, {ref::attention::segment, -2}), "n_threads -2");
  EXPECT_PREPACK_ERROR(m.prefill(prepack::packed_layout<>()), "layout: empty");
  const std::vector<long long> ctx{2, 0};
  const std::vector<int> toks{1, 2, 3, 4, 5};
  const auto chunk =
      prepack::make_layout(prepack::first_fit_decreasing(len), prepack::span<const int>(toks),
                           prepack::span<const long long>(ctx));
  EXPECT_PREPACK_ERROR(m.prefill(chunk), "prompt 0: context 2: a packed prefill has no cache");
  if (!ref::onednn_available()) {
    EXPECT_PREPACK_ERROR(m.prefill(good, {ref::attention::segment, 0, ref::gemm_backend::onednn}),
                         "this build has no oneDNN");
  }
}

TEST(ReferenceErrors, DecodeNeedsRoomAndMatchingShapes) {
  ref::config c;
  const ref::model m(c, 1);
  const std::vector<std::vector<int>> prompts{{1, 2, 3}, {4}};
  // Blocks of 4: room for 4 positions each.
  auto [cache, logits] = ref::prefill_alone(m, prompts, 1, {}, 4);
  EXPECT_PREPACK_ERROR(ref::greedy_decode(m, cache, logits, 3),
                       "sequence 0: its blocks hold 4 positions, 2 more after 3 do not fit");
  EXPECT_PREPACK_ERROR(ref::greedy_decode(m, cache, logits.topRows(1), 2),
                       "first_logits: 1 x 512 for 2 sequences");
  EXPECT_EQ(cache.seqs[0].length, 3u);
  EXPECT_EQ(ref::greedy_decode(m, cache, logits, 2).tokens[1].size(), 2u);
  EXPECT_EQ(cache.seqs[0].length, 4u);
  EXPECT_EQ(cache.seqs[1].length, 2u);
}

}  // namespace
