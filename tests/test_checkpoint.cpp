// Tests of the checkpoint component (prepack/checkpoint/: gguf.hpp, safetensors.hpp,
// load.hpp) on files the tests write: every tensor type (F32, F16, BF16,
// Q8_0), tied and untied embeddings, Qwen2 biases; weights round-trip exactly or within the
// type's own rounding; a model loaded from a file prefills as the in-memory model it was written
// from (GGUF with llama.cpp's Q/K permutation, and unpermuted qwen2); bad files give
// prepack::error naming the file and the item, never a crash, however they are cut.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "checkpoint_writer.hpp"
#include "prepack/checkpoint.hpp"
#include "reference_common.hpp"

namespace {

namespace ref = prepack::reference;
namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("prepack_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A config whose rows are whole Q8_0 blocks (32 values).
ref::config block_config(bool bias, bool tied) {
  ref::config c;
  c.vocab = 96;
  c.hidden = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn = 96;
  c.rope_theta = 50000.0;
  c.rms_eps = 1e-6f;
  c.qkv_bias = bias;
  c.tied_embeddings = tied;
  return c;
}

// Largest |loaded - expected| over every tensor, with expected = the writer's values after the
// format's own rounding.
double weight_diff(const ref::config& c, const ref::weights& loaded, const ref::weights& original,
                   test::dtype t) {
  const auto a = test::hf_tensors(c, loaded), b = test::hf_tensors(c, original);
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].name, b[k].name);
    const auto want = test::rounded(b[k].values, b[k].shape.size() == 2 ? t : test::dtype::f32);
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max<double>(worst, std::abs(a[k].values[i] - want[i]));
    }
  }
  return worst;
}

double logits_diff(const ref::model& a, const ref::model& b, std::mt19937_64& rng) {
  const auto prompts = test::random_prompts(rng, {17, 5, 40}, a.cfg().vocab);
  const auto l =
      prepack::make_layout(prepack::first_fit_decreasing(test::lengths_of(prompts)), prompts);
  return (a.prefill(l).logits - b.prefill(l).logits).cwiseAbs().maxCoeff();
}

TEST(Checkpoint, GgufRoundTripsEveryTypeAndLoadsTheSameFunction) {
  std::mt19937_64 rng(3);
  const std::string dir = temp_dir("gguf");
  for (const char* arch : {"llama", "qwen2"}) {
    for (bool tied : {false, true}) {
      const ref::config c = block_config(std::string(arch) == "qwen2", tied);
      const ref::weights w = ref::random_weights(c, 5);
      for (test::dtype t :
           {test::dtype::f32, test::dtype::f16, test::dtype::bf16, test::dtype::q8_0}) {
        const std::string path =
            dir + "/" + arch + (tied ? "_tied_" : "_") + test::dtype_name(t) + ".gguf";
        test::write_file(path, test::gguf_bytes(c, w, {arch, t, "test", true}));
        const auto ck = prepack::checkpoint::load(path);
        const std::string where = path;
        EXPECT_EQ(ck.info.architecture, arch);
        EXPECT_EQ(ck.info.cfg.hidden, c.hidden);
        EXPECT_EQ(ck.info.cfg.n_kv_heads, c.n_kv_heads);
        EXPECT_EQ(ck.info.cfg.vocab, c.vocab);
        EXPECT_EQ(ck.info.cfg.tied_embeddings, tied);
        EXPECT_EQ(ck.info.cfg.qkv_bias, c.qkv_bias);
        EXPECT_EQ(ck.info.cfg.rope_theta, c.rope_theta);
        EXPECT_EQ(ck.info.tensor_types.count(test::dtype_name(t)), 1u) << where;
        const double d = weight_diff(c, ck.weights, w, t);
        // Exactly the format's rounding of every value (Q/K unpermuted, matrices transposed).
        EXPECT_EQ(d, 0.0) << where;
        if (t == test::dtype::f32) {
          const ref::model loaded(ck.info.cfg, ck.weights), original(c, w);
          const double ld = logits_diff(loaded, original, rng);
          std::printf("%s: loaded vs in-memory model: max abs diff logits %.3g\n", path.c_str(),
                      ld);
          EXPECT_LE(ld, 1e-4) << where;  // fp32 rounding (GEMM blocking may differ)
          // Built as the file is read (checkpoint::open), the same model.
          const auto opened = prepack::checkpoint::open(path);
          const ref::model streamed(opened.info.cfg, *opened.weights);
          EXPECT_LE(logits_diff(streamed, original, rng), 1e-4) << where;
        }
      }
    }
  }
  fs::remove_all(dir);
}

// A GGUF's quantized tensors held as stored (open_options::hold_quantized): the model holds the
// file's blocks (the projections', the embedding's and the LM head's bytes, which inspect
// reports) and computes what the model of the dequantized file computes, Q/K rows of llama's
// layout unpermuted as whole rows, biases and tied embeddings (one table for both) included.
TEST(Checkpoint, QuantizedProjectionsHeldAsStoredComputeTheDequantizedFunction) {
  std::mt19937_64 rng(6);
  const std::string dir = temp_dir("held");
  for (const char* arch : {"llama", "qwen2"}) {
    for (bool tied : {false, true}) {
      const ref::config c = block_config(std::string(arch) == "qwen2", tied);
      const ref::weights w = ref::random_weights(c, 9);
      const std::string path = dir + "/" + arch + (tied ? "_tied" : "") + ".gguf";
      test::write_file(path, test::gguf_bytes(c, w, {arch, test::dtype::q8_0, "held", false}));
      const auto info = prepack::checkpoint::inspect(path);
      EXPECT_EQ(info.quantized_projection_params, c.projection_params()) << path;
      EXPECT_EQ(info.quantized_projection_bytes, c.projection_params() / 32 * 34) << path;
      const auto widened_src = prepack::checkpoint::open(path);
      const auto held_src = prepack::checkpoint::open(path, {true});
      const ref::model widened(widened_src.info.cfg, *widened_src.weights);
      const ref::model held(held_src.info.cfg, *held_src.weights,
                            {ref::weight_type::f32, ref::gemm_backend::eigen});
      EXPECT_FALSE(widened.quantized()) << path;
      ASSERT_TRUE(held.quantized()) << path;
      EXPECT_EQ(held.quantized_types().size(), 1u) << path;
      // The projections, the embedding and the untied LM head (all Q8_0 in this file).
      EXPECT_EQ(held.quantized_types().at("Q8_0"), 7 * c.n_layers + (tied ? 1 : 2)) << path;
      EXPECT_EQ(info.quantized_embedding_params, c.embedding_params()) << path;
      EXPECT_EQ(info.quantized_embedding_bytes, c.embedding_params() / 32 * 34) << path;
      // Held: every other parameter in fp32, the rest as the file's bytes.
      EXPECT_EQ(static_cast<double>(held.weight_bytes()),
                4.0 * (c.n_params() - c.projection_params() - c.embedding_params()) +
                    info.quantized_projection_bytes + info.quantized_embedding_bytes)
          << path;
      const auto prompts = test::random_prompts(rng, {17, 5, 40}, c.vocab);
      const auto l =
          prepack::make_layout(prepack::first_fit_decreasing(test::lengths_of(prompts)), prompts);
      const auto a = widened.prefill(l), b = held.prefill(l);
      const double scale = std::max(1.0f, a.logits.cwiseAbs().maxCoeff());
      EXPECT_LE((a.logits - b.logits).cwiseAbs().maxCoeff() / scale, 1e-5) << path;
    }
  }
  fs::remove_all(dir);
}

// dequantize_fast (the decoding inside the GEMMs of held weights: vectorised on AVX2 and
// AVX-512 builds, the block loops elsewhere) against dequantize (ggml's values, bit for bit:
// the gguf oracle checks it): every block type, random blocks with finite fp16 scales. Types
// whose values are one product (d q, d sc q) give the same bits; those with an offset (Q4_1,
// Q5_1 and the K-quants' mins, which dequantize_fast may fuse with the product) within one
// rounding of the product. Written to an unaligned destination.
TEST(Checkpoint, FastDequantizationIsExactOrWithinOneRounding) {
  using prepack::checkpoint::ggml_type;
  std::mt19937 rng(41);
  struct kind {
    ggml_type type;
    std::vector<int> scales;  // byte offsets of the block's fp16 scales (and mins)
    bool offset;
  };
  const kind kinds[] = {{ggml_type::q4_0, {0}, false},   {ggml_type::q4_1, {0, 2}, true},
                        {ggml_type::q5_0, {0}, false},   {ggml_type::q5_1, {0, 2}, true},
                        {ggml_type::q8_0, {0}, false},   {ggml_type::q2_k, {80, 82}, true},
                        {ggml_type::q3_k, {108}, false}, {ggml_type::q4_k, {0, 2}, true},
                        {ggml_type::q5_k, {0, 2}, true}, {ggml_type::q6_k, {208}, false},
                        {ggml_type::iq4_nl, {0}, false}, {ggml_type::iq4_xs, {0}, false}};
  for (const kind& k : kinds) {
    const auto b = *prepack::checkpoint::dequantizable_block(k.type);
    const std::size_t blocks = 9, n = blocks * b.elements;
    std::vector<unsigned char> bytes(blocks * b.bytes);
    for (auto& x : bytes) x = static_cast<unsigned char>(rng());
    for (std::size_t i = 0; i < blocks; ++i) {
      for (const int at : k.scales) {  // +-[0.5, 1) 2^-7
        const float v = std::ldexp(0.5f + static_cast<float>(rng() % 1000) / 2000.0f, -7);
        const std::uint16_t h = prepack::half::from_float(rng() % 2 != 0 ? v : -v);
        bytes[i * b.bytes + static_cast<std::size_t>(at)] = static_cast<unsigned char>(h & 0xFF);
        bytes[i * b.bytes + static_cast<std::size_t>(at) + 1] = static_cast<unsigned char>(h >> 8);
      }
    }
    std::vector<float> exact(n), fast(n + 1, -1.0f);
    prepack::checkpoint::dequantize(k.type, bytes.data(), n, exact.data());
    prepack::checkpoint::dequantize_fast(k.type, bytes.data(), n, fast.data() + 1);
    const char* name = prepack::checkpoint::ggml_type_name(k.type);
    EXPECT_EQ(fast[0], -1.0f) << name << ": wrote before its output";
    for (std::size_t i = 0; i < n; ++i) {
      const float e = exact[i], f = fast[i + 1];
      if (!k.offset) {
        EXPECT_EQ(f, e) << name << " value " << i;
        continue;
      }
      // d q - m rounded once against twice: within half an ulp of the product, whose size is
      // at most the block's largest |value| plus its largest offset (here below 2^-1).
      float largest = 0.0f;
      const std::size_t b0 = i / b.elements * b.elements;
      for (std::size_t j = b0; j < b0 + b.elements; ++j)
        largest = std::max(largest, std::abs(exact[j]));
      EXPECT_LE(std::abs(f - e), std::ldexp(largest + 0.5f, -23)) << name << " value " << i;
    }
  }
}

// The Q/K permutation matters: read as unpermuted, a llama GGUF computes another function.
TEST(Checkpoint, PermutedQKLoadsIntoTheUnpermutedFunction) {
  std::mt19937_64 rng(4);
  const std::string dir = temp_dir("perm");
  const ref::config c = block_config(false, false);
  const ref::weights w = ref::random_weights(c, 8);
  const std::string llama = dir + "/llama.gguf";
  test::write_file(llama, test::gguf_bytes(c, w, {"llama", test::dtype::f32, "p", false}));
  const auto ck = prepack::checkpoint::load(llama);
  const ref::model original(c, w), loaded(ck.info.cfg, ck.weights);
  EXPECT_LE(logits_diff(original, loaded, rng), 1e-4);
  // The same bytes claimed unpermuted (a qwen2 header on llama's rows) give other logits.
  auto bytes = test::gguf_bytes(c, w, {"llama", test::dtype::f32, "p", false});
  prepack::checkpoint::gguf_file parsed(prepack::span<const unsigned char>(bytes), "x");
  ref::weights wrong = ck.weights;
  const auto& q = *parsed.find("blk.0.attn_q.weight");
  std::vector<float> raw(static_cast<std::size_t>(q.elements()));
  parsed.read(q, prepack::span<float>(raw));
  wrong.layers[0].wq = prepack::checkpoint::detail::transposed(
      raw, static_cast<std::size_t>(c.q_dim()), static_cast<std::size_t>(c.hidden));
  EXPECT_GT(logits_diff(original, ref::model(c, wrong), rng), 1e-3);
  fs::remove_all(dir);
}

TEST(Checkpoint, SafetensorsSingleAndShardedRoundTrip) {
  std::mt19937_64 rng(5);
  for (bool bias : {false, true}) {
    for (bool tied : {false, true}) {
      const ref::config c = block_config(bias, tied);
      const ref::weights w = ref::random_weights(c, 9);
      for (test::dtype t : {test::dtype::f32, test::dtype::f16, test::dtype::bf16}) {
        for (int shards : {1, 3}) {
          const std::string dir = temp_dir("hf");
          test::write_hf_dir(dir, c, w, t, shards);
          const auto ck = prepack::checkpoint::load(dir);
          EXPECT_EQ(ck.info.format, "safetensors");
          EXPECT_EQ(ck.info.cfg.qkv_bias, bias);
          EXPECT_EQ(ck.info.cfg.tied_embeddings, tied);
          // Norms and biases go through the same dtype here (safetensors writes one dtype).
          const auto a = test::hf_tensors(c, ck.weights), b = test::hf_tensors(c, w);
          for (std::size_t k = 0; k < a.size(); ++k) {
            EXPECT_EQ(a[k].values, test::rounded(b[k].values, t)) << dir << " " << a[k].name;
          }
          if (t == test::dtype::f32) {
            EXPECT_LE(logits_diff(ref::model(ck.info.cfg, ck.weights), ref::model(c, w), rng),
                      1e-4);
          }
          fs::remove_all(dir);
        }
      }
    }
  }
}

// Every cut of a GGUF file is refused with prepack::error (never a crash); the refusals name
// the file.
TEST(CheckpointErrors, TruncatedGgufFilesAreRefused) {
  const ref::config c = block_config(false, false);
  const auto bytes =
      test::gguf_bytes(c, ref::random_weights(c, 1), {"llama", test::dtype::q8_0, "t", true});
  std::mt19937_64 rng(6);
  for (int k = 0; k < 400; ++k) {
    const std::size_t cut = k < 200 ? static_cast<std::size_t>(k) : rng() % bytes.size();
    std::vector<unsigned char> part(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    try {
      prepack::checkpoint::gguf_file g(prepack::span<const unsigned char>(part), "cut.gguf");
      ADD_FAILURE() << "a GGUF cut at byte " << cut << " of " << bytes.size() << " was accepted";
    } catch (const prepack::error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
    }
  }
}

// Arrays of arrays are skipped however they nest, up to 16 deep; deeper ones are refused by
// name instead of recursing without bound.
TEST(CheckpointErrors, NestedMetadataArraysAreSkippedWithinABound) {
  const auto file = [](int depth) {
    test::byte_writer b;
    for (char ch : {'G', 'G', 'U', 'F'}) b.put(ch);
    b.put<std::uint32_t>(3);
    b.put<std::uint64_t>(0);  // tensors
    b.put<std::uint64_t>(2);  // metadata entries
    b.str("deep");
    b.put<std::uint32_t>(9);
    for (int k = 1; k < depth; ++k) {  // an array holding one array, depth - 1 times
      b.put<std::uint32_t>(9);
      b.put<std::uint64_t>(1);
    }
    b.put<std::uint32_t>(4);  // the innermost: two uint32
    b.put<std::uint64_t>(2);
    b.put<std::uint32_t>(5);
    b.put<std::uint32_t>(6);
    b.str("general.name");  // a key after it, read at the right place
    b.put<std::uint32_t>(8);
    b.str("after");
    return b.bytes;
  };
  for (int depth : {1, 2, 16}) {
    const auto bytes = file(depth);
    const prepack::checkpoint::gguf_file g(prepack::span<const unsigned char>(bytes),
                                           "nested.gguf");
    EXPECT_EQ(g.text("general.name"), "after") << "depth " << depth;
  }
  const auto deep = file(17);
  EXPECT_PREPACK_ERROR(
      prepack::checkpoint::gguf_file(prepack::span<const unsigned char>(deep), "deep.gguf"),
      "deep.gguf: metadata deep: arrays nested more than 16 deep");
}

// Bytes of a little GGUF file with its fields patched.
struct gguf_fixture : ::testing::Test {
  ref::config c = block_config(false, false);
  ref::weights w = ref::random_weights(c, 2);
  std::string dir = temp_dir("bad");
  void TearDown() override { fs::remove_all(dir); }
  std::string write(const std::vector<unsigned char>& b, const std::string& name) {
    const std::string p = dir + "/" + name;
    test::write_file(p, b);
    return p;
  }
  std::vector<unsigned char> good() {
    return test::gguf_bytes(c, w, {"llama", test::dtype::f32, "t", false});
  }
};

TEST_F(gguf_fixture, HeaderErrorsNameTheFileAndItem) {
  auto magic = good();
  magic[0] = 'X';
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(magic, "magic.gguf")),
                       "magic.gguf: not a GGUF file (wrong magic)");
  auto version = good();
  version[4] = 9;
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(version, "v.gguf")),
                       "v.gguf: GGUF version 9");
  auto count = good();
  for (int k = 8; k < 16; ++k) count[static_cast<std::size_t>(k)] = 0x40;  // 2^62-ish tensors
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(count, "count.gguf")),
                       "count.gguf: tensor count");
  auto meta = good();
  for (int k = 16; k < 24; ++k) meta[static_cast<std::size_t>(k)] = 0x7f;
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(meta, "meta.gguf")),
                       "meta.gguf: metadata count");
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir + "/missing.gguf"),
                       "missing.gguf: cannot open");
}

TEST_F(gguf_fixture, TensorErrorsNameTheFileAndTensor) {
  const auto bytes = good();
  prepack::checkpoint::gguf_file g(prepack::span<const unsigned char>(bytes), "g");
  const auto& t = g.tensors().back();
  // Find the tensor info of the last tensor: its type and offset fields follow its dims.
  const std::string name = t.name;
  std::string needle(8, '\0');  // the name as GGUF writes it: its u64 length first
  needle[0] = static_cast<char>(name.size());
  needle += name;
  const auto at =
      std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end()) - bytes.begin();
  const std::size_t type_at = static_cast<std::size_t>(at) + needle.size() + 4 + 8 * t.dims.size();
  auto unknown = bytes;
  unknown[type_at] = 16;  // IQ2_XXS: not supported
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(unknown, "type.gguf")),
                       "type.gguf: tensor " + name + ": type IQ2_XXS (16) is not supported");
  unknown[type_at] = 77;  // no ggml type
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(unknown, "type.gguf")),
                       "type.gguf: tensor " + name + ": type 77 is not supported");
  auto offset = bytes;
  offset[type_at + 4 + 5] = 0x10;  // offset += 2^44
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(offset, "offset.gguf")),
                       "offset.gguf: tensor " + name + ": data at");
  auto cut = bytes;
  cut.resize(cut.size() - 10);  // the last tensor's data runs past the end
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(cut, "short.gguf")),
                       "lies past the end of the file");
  // A shape that disagrees with the metadata: ffn of 64 claimed for 96-wide tensors.
  auto patched = test::gguf_bytes(c, w, {"llama", test::dtype::f32, "t", false});
  const std::string key = "llama.feed_forward_length";
  const auto k =
      std::search(patched.begin(), patched.end(), key.begin(), key.end()) - patched.begin();
  patched[static_cast<std::size_t>(k) + key.size() + 4] = 64;
  EXPECT_PREPACK_ERROR(
      prepack::checkpoint::load(write(patched, "shape.gguf")),
      "shape.gguf: tensor model.layers.0.mlp.gate_proj.weight is 96 x 64, the config says 64 x 64");
  // A missing tensor: one layer more than the file holds.
  auto layers = test::gguf_bytes(c, w, {"llama", test::dtype::f32, "t", false});
  const std::string bk = "llama.block_count";
  const auto b = std::search(layers.begin(), layers.end(), bk.begin(), bk.end()) - layers.begin();
  layers[static_cast<std::size_t>(b) + bk.size() + 4] = 3;
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(layers, "missing.gguf")),
                       "missing.gguf: tensor model.layers.2.input_layernorm.weight missing");
  {  // Opened (headers only), the same file fails when the model reads that layer.
    const auto opened = prepack::checkpoint::open(dir + "/missing.gguf");
    EXPECT_PREPACK_ERROR(ref::model(opened.info.cfg, *opened.weights),
                         "missing.gguf: tensor model.layers.2.input_layernorm.weight missing");
  }
  // An architecture the model cannot run.
  auto arch = test::gguf_bytes(c, w, {"llama", test::dtype::f32, "t", false});
  const std::string ak = "llama";
  const auto a = std::search(arch.begin() + 24, arch.end(), ak.begin(), ak.end()) - arch.begin();
  arch[static_cast<std::size_t>(a)] = 'x';
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(write(arch, "arch.gguf")),
                       "arch.gguf: architecture xlama is not supported");
}

// Files that vanish between inspecting a checkpoint and loading it, or a shard that its index
// lists and that is gone: prepack::error naming the file and why, never a std::filesystem or
// system exception.
TEST(CheckpointErrors, FilesThatVanishAreNamed) {
  const ref::config c = block_config(false, false);
  const ref::weights w = ref::random_weights(c, 4);
  const std::string dir = temp_dir("vanish");
  const std::string gguf = dir + "/gone.gguf";
  test::write_file(gguf, test::gguf_bytes(c, w, {"llama", test::dtype::f32, "t", false}));
  EXPECT_EQ(prepack::checkpoint::inspect(gguf).cfg.hidden, c.hidden);
  fs::remove(gguf);
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(gguf),
                       gguf + ": cannot open (No such file or directory)");
  const std::string hf = dir + "/hf";
  fs::create_directories(hf);
  test::write_hf_dir(hf, c, w, test::dtype::f32, 3);
  EXPECT_EQ(prepack::checkpoint::inspect(hf).cfg.hidden, c.hidden);
  fs::remove(hf + "/model-00002-of-00003.safetensors");
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(hf),
                       "model-00002-of-00003.safetensors: cannot open (No such file or directory)");
  fs::remove(hf + "/config.json");
  EXPECT_PREPACK_ERROR(prepack::checkpoint::inspect(hf), "config.json");
  // A directory where a file should be.
  fs::create_directories(hf + "/config.json");
  EXPECT_PREPACK_ERROR(prepack::checkpoint::inspect(hf), "config.json");
  fs::remove_all(dir);
}

TEST(CheckpointErrors, SafetensorsErrorsNameTheFileAndItem) {
  const ref::config c = block_config(false, false);
  const ref::weights w = ref::random_weights(c, 3);
  const std::string dir = temp_dir("badhf");
  test::write_hf_dir(dir, c, w, test::dtype::f32, 1);
  auto bytes = std::vector<unsigned char>();
  {
    std::ifstream in(dir + "/model.safetensors", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto rewrite = [&](const std::vector<unsigned char>& b) {
    test::write_file(dir + "/model.safetensors", b);
  };
  auto len = bytes;
  len[6] = 0x7f;
  rewrite(len);
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir), "model.safetensors: header of");
  auto json = bytes;
  json[8] = '!';
  rewrite(json);
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir), "model.safetensors: header is not JSON");
  auto cut = bytes;
  cut.resize(cut.size() - 4);
  rewrite(cut);
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir), "lie past the end of the file");
  const std::string f32 = "\"F32\"";
  auto dtype = bytes;
  const auto at = std::search(dtype.begin(), dtype.end(), f32.begin(), f32.end()) - dtype.begin();
  dtype[static_cast<std::size_t>(at) + 1] = 'I';
  rewrite(dtype);
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir), "dtype I32 is not supported");
  rewrite(bytes);
  EXPECT_NO_THROW(prepack::checkpoint::load(dir));
  // config.json: an architecture it cannot run, a missing field, rope scaling.
  auto j = test::hf_config(c);
  j["architectures"] = {"GPT2LMHeadModel"};
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir),
                       "config.json: architecture 'GPT2LMHeadModel' is not supported");
  j = test::hf_config(c);
  j.erase("hidden_size");
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir), "config.json: hidden_size missing");
  j = test::hf_config(c);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir),
                       "config.json: rope_scaling rope_type 'yarn' is not supported (default, "
                       "linear, llama3)");
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 4.0},
                       {"high_freq_factor", 1.0}};
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir),
                       "rope_scaling llama3: low_freq_factor 4, high_freq_factor 1");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", "two"}};
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir), "rope_scaling.factor is not a number");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_EQ(prepack::checkpoint::inspect(dir).cfg.rope_freq_factors,
            std::vector<double>(static_cast<std::size_t>(c.rotary_dim() / 2), 2.0));
  j = test::hf_config(c);
  j["num_hidden_layers"] = 5;
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_PREPACK_ERROR(prepack::checkpoint::load(dir),
                       "tensor model.layers.2.input_layernorm.weight missing");
  fs::remove_all(dir);
}

}  // namespace
