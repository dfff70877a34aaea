// support/model_flags.hpp - the model every example binary runs, from the same flags: a seeded
// Llama-style model (--vocab --hidden --layers --heads --kv-heads --head-dim --ffn --rope-theta)
// or a checkpoint (--model PATH, when the binary is built with prepack::checkpoint and
// PREPACK_SUPPORT_CHECKPOINTS), its weights in fp32 or bf16 (--bf16), its GEMMs on a backend
// (--backend) with a thread count (--threads). Not part of the library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "prepack/reference.hpp"
#include "support/cli.hpp"
#ifdef PREPACK_SUPPORT_CHECKPOINTS
#include "prepack/checkpoint.hpp"
#endif

namespace support {

namespace ref = prepack::reference;

/// The model flags as given: filled by CLI11 (add_model_flags), read by parse_model.
struct model_flags {
  int vocab = 4096, hidden = 256, layers = 4, heads = 8, kv_heads = 2, head_dim = 32, ffn = 688;
  double rope_theta = 10000.0;
  std::string path;  // --model
  bool bf16 = false;
  bool widen = false;  // --widen: a quantized checkpoint's projections dequantized to fp32
  bool int8 = false;   // --int8-activations: held rows dotted with 8-bit activations
  std::string backend = "auto";
  int threads = 0;
  long long memory_limit_mib = 0;  // 0: 80% of this machine's memory
};

/// Adds the model flags to `app`, bound to `f`, under the heading "Model (default: ...)".
/// A seeded model's shape and --model exclude each other.
inline void add_model_flags(CLI::App& app, model_flags& f) {
  const std::string group = "Model (default: a Llama-style model with seeded weights)";
  const auto shape = [&](const char* name, int& v, long long lo, long long hi, const char* what) {
    return app.add_option(name, v, what)->check(integer(lo, hi))->type_name("N")->group(group);
  };
  std::vector<CLI::Option*> seeded{
      shape("--vocab", f.vocab, 2, 1 << 20, "vocabulary size (default 4096)"),
      shape("--hidden", f.hidden, 1, 1 << 14, "hidden size (default 256)"),
      shape("--layers", f.layers, 1, 256, "decoder layers (default 4)"),
      shape("--heads", f.heads, 1, 1024, "query heads (default 8)"),
      shape("--kv-heads", f.kv_heads, 1, 1024, "key-value heads, dividing --heads (default 2)"),
      shape("--head-dim", f.head_dim, 0, 1024, "head size (default 32; 0: hidden / heads)"),
      shape("--ffn", f.ffn, 1, 1 << 16, "feed-forward size (default 688)"),
      app.add_option("--rope-theta", f.rope_theta, "RoPE base (default 10000)")
          ->check(real(1.0001, 1e12))
          ->type_name("X")
          ->group(group)};
  CLI::Option* model =
      app.add_option("--model", f.path,
                     "a real checkpoint instead: a .gguf file (llama, qwen2, qwen3; F32, F16,\n"
                     "BF16 or ggml's quantized blocks) or a Hugging Face model directory\n"
                     "(config.json + safetensors)")
          ->check(text())
          ->type_name("PATH")
          ->group(group);
  for (CLI::Option* o : seeded) o->excludes(model);
  app.add_flag("--widen", f.widen,
               "dequantize a quantized checkpoint's projections to fp32 at load (4\n"
               "bytes a weight; default: held as the file stores them, about its\n"
               "size, and decoded inside the GEMMs)")
      ->needs(model)
      ->group(group);
  app.add_flag("--int8-activations", f.int8,
               "dot the held Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q3_K / Q4_K / Q5_K /\n"
               "Q6_K / IQ4_NL / IQ4_XS rows\n"
               "with activations quantized to 8 bits per 32 values, as llama.cpp does\n"
               "(faster; each dot within half a quantization step of its activations,\n"
               "not fp32-exact)")
      ->needs(model)
      ->excludes("--widen")
      ->group(group);
  app.add_flag("--bf16", f.bf16,
               "hold the projection weights in bf16 (activations rounded to bf16,\n"
               "products accumulated in fp32; native where oneDNN runs bf16 here,\n"
               "emulated elsewhere, and the output says which)")
      ->group(group);
  const std::vector<std::string> backends{"auto", "eigen", "onednn"};
  app.add_option("--backend", f.backend,
                 "the GEMM library (default auto: oneDNN when the build has it)")
      ->check(one_of(backends))
      ->type_name(choices(backends))
      ->group(group);
  app.add_option("--threads", f.threads, "threads (default: all cores)")
      ->check(integer(0, 1024))
      ->type_name("N")
      ->group(group);
  app.add_option("--memory-limit", f.memory_limit_mib,
                 "refuse, before allocating, a run estimated to need more than MIB\n"
                 "mebibytes (default: 80% of this machine's memory); the refusal says\n"
                 "what would fit (--bf16, a smaller model or workload)")
      ->check(integer(1, std::int64_t{1} << 40))
      ->type_name("MIB")
      ->group(group);
}

/// A model as the flags describe it, before its weights exist.
struct model_choice {
  ref::config cfg;
  std::string path;  // a checkpoint, or empty: seeded weights
  std::uint64_t seed = 1;
  ref::model_options options;
  ref::gemm_backend backend = ref::gemm_backend::automatic;  // resolved
  int threads = 0;
  double memory_limit = 0;  // bytes a run may need; 0: 80% of the machine's memory
  std::optional<ref::bf16_speed> bf16_measured;  // with --bf16: bf16 against fp32, timed here
  bool hold_quantized = true;                    // a checkpoint's quantized projections as stored
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  std::optional<prepack::checkpoint::info> info;  // the checkpoint's, read from its headers
#endif
};

/// bf16 against fp32 on this CPU, timed on the model's feed-forward shape (hidden x ffn, capped
/// at 2048 x 8192 to keep it to a fraction of a second) over 128 rows, on its backend and
/// threads: what --bf16 costs or gains here.
inline ref::bf16_speed measure_bf16(const model_choice& m) {
  return ref::measure_bf16_speed(m.backend, 128, std::min(m.cfg.hidden, 2048),
                                 std::min(m.cfg.ffn, 8192), m.threads);
}

/// What --bf16 does to speed here, as a clause: "bf16 runs at 0.58x fp32's speed here (...):
/// it saves memory, not time".
inline std::string bf16_verdict(const ref::bf16_speed& s) {
  return s.describe() + (s.faster() ? ": faster, and half the projections' memory"
                                    : ": it saves memory, not time");
}

/// The model the parsed flags describe (a checkpoint's headers read, without converting a
/// weight). Throws usage_error for a checkpoint this build cannot read, prepack::error for a bad
/// config or checkpoint.
inline model_choice parse_model(const model_flags& f, std::uint64_t seed) {
  model_choice m;
  m.seed = seed;
  m.path = f.path;
  ref::config& c = m.cfg;
  if (!m.path.empty()) {
#ifdef PREPACK_SUPPORT_CHECKPOINTS
    m.info = prepack::checkpoint::inspect(m.path);
    c = m.info->cfg;
#else
    throw usage_error("--model: this build has no checkpoint loader (needs nlohmann-json)");
#endif
  } else {
    c.vocab = f.vocab;
    c.hidden = f.hidden;
    c.n_layers = f.layers;
    c.n_heads = f.heads;
    c.n_kv_heads = f.kv_heads;
    c.head_dim = f.head_dim;
    c.ffn = f.ffn;
    c.rope_theta = f.rope_theta;
  }
  c.validate();
  m.options.weights = f.bf16 ? ref::weight_type::bf16 : ref::weight_type::f32;
  m.backend = ref::resolve(f.backend == "eigen"    ? ref::gemm_backend::eigen
                           : f.backend == "onednn" ? ref::gemm_backend::onednn
                                                   : ref::gemm_backend::automatic);
  m.options.layout = m.backend;  // the weights laid out for the backend that multiplies them
  m.threads = f.threads;
  m.memory_limit = static_cast<double>(f.memory_limit_mib) * 1024.0 * 1024.0;
  m.hold_quantized = !f.widen;
  if (f.int8) m.options.activations = ref::activation_type::int8;
  if (f.bf16) m.bf16_measured = measure_bf16(m);
  return m;
}

/// Bytes the model's weights hold once built (the projections 4 bytes a weight, 2 with --bf16,
/// or a quantized checkpoint's projections as the file stores them unless --widen; embeddings
/// and norms fp32) and at the peak of building them: the model is built a layer at a time
/// (seeded, or read from the checkpoint), so the peak is what it holds plus one layer's
/// widened projections in fp32 twice over (as read, and fused).
struct weight_memory {
  double held = 0, building = 0;
};
inline weight_memory estimate_weights(const model_choice& m, ref::weight_type type,
                                      bool hold_quantized) {
  const ref::config& c = m.cfg;
  double q_params = 0, q_bytes = 0;  // projections held as stored
  double e_params = 0, e_bytes = 0;  // the embedding and LM head held as stored
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  if (m.info && hold_quantized) {
    q_params = m.info->quantized_projection_params;
    q_bytes = m.info->quantized_projection_bytes;
    e_params = m.info->quantized_embedding_params;
    e_bytes = m.info->quantized_embedding_bytes;
  }
#else
  (void)hold_quantized;
#endif
  weight_memory w;
  const double widened = c.projection_params() - q_params;
  w.held = ref::weight_bytes(c, type) - (type == ref::weight_type::bf16 ? 2.0 : 4.0) * q_params +
           q_bytes - 4.0 * e_params + e_bytes;
  w.building = w.held + 2.0 * 4.0 * widened / c.n_layers;
  return w;
}
inline weight_memory estimate_weights(const model_choice& m, ref::weight_type type) {
  return estimate_weights(m, type, m.hold_quantized);
}
inline weight_memory estimate_weights(const model_choice& m) {
  return estimate_weights(m, m.options.weights);
}

/// The machine's physical memory in bytes (0 if unknown).
inline double machine_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0.0;
}

inline std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

/// Refuses, before a weight is allocated, a run whose peak (the weights' estimate above plus
/// `other` bytes) would pass the memory limit (--memory-limit, else 80% of this machine's
/// memory): usage_error naming the sizes and what would fit instead: --bf16 when that fits,
/// a smaller model when the weights alone do not, else `remedy` (the workload's part).
inline void admit_memory(const model_choice& m, double other, const std::string& remedy) {
  const auto peak = [&](const weight_memory& w) { return std::max(w.building, w.held + other); };
  const weight_memory w = estimate_weights(m);
  const weight_memory b16 = estimate_weights(m, ref::weight_type::bf16);
  const weight_memory held = estimate_weights(m, m.options.weights, true);
  const double machine = machine_memory();
  const double limit = m.memory_limit > 0 ? m.memory_limit : 0.8 * machine;
  if (limit <= 0 || peak(w) <= limit) return;
  const std::string where = m.memory_limit > 0 ? "the --memory-limit of " + mib(limit)
                                               : "80% of the " + mib(machine) + " of memory here";
  std::string what = "this workload needs about " + mib(peak(w)) + ", more than " + where +
                     " (the weights " + mib(w.held) + ", " + mib(w.building) +
                     " while building them); ";
  const bool f32 = m.options.weights == ref::weight_type::f32;
  if (!m.hold_quantized && held.held < w.held && peak(held) <= limit) {
    what += "without --widen it fits: the file's quantized projections held as stored take " +
            mib(held.held) + " of weights, about " + mib(peak(held)) + " in all";
  } else if (f32 && peak(b16) <= limit) {
    what += "--bf16 fits: it holds the projection weights in half the memory (" + mib(b16.held) +
            " of weights, about " + mib(peak(b16)) + " in all); " + bf16_verdict(measure_bf16(m));
  } else if (std::min(w.building, b16.building) > limit) {
    what += std::string("use a smaller model") +
            (f32 ? " (even with --bf16 its weights need " + mib(b16.building) + ")" : "");
    if (!m.path.empty() && held.held < w.held) {
      what += "; without --widen its quantized projections need " + mib(held.held);
    } else if (!m.path.empty() && held.held == estimate_weights(m, m.options.weights, false).held) {
      what += " or a quantized file of it (its quantized projections are held as stored)";
    }
  } else {
    what += remedy;
  }
  throw usage_error(what);
}

/// The model's weights: loaded from the checkpoint, or seeded. Throws prepack::error for a bad
/// checkpoint, std::bad_alloc when the weights do not fit.
inline ref::model build_model(const model_choice& m) {
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  if (!m.path.empty()) {
    const prepack::checkpoint::opened ck = prepack::checkpoint::open(m.path, {m.hold_quantized});
    return ref::model(ck.info.cfg, *ck.weights, m.options);
  }
#endif
  return ref::model(m.cfg, m.seed, m.options);
}

/// How bf16 weights run here ("native (avx512_core_bf16)", "emulated on avx2"), or "" for fp32.
inline std::string bf16_description(const model_choice& m) {
  if (m.options.weights != ref::weight_type::bf16) return "";
  return ref::bf16_path(m.backend).describe();
}

/// How a checkpoint's quantized projections are held, as a line ("" when it has none):
/// "projections: 28.2M parameters held as stored (22.0 MiB; 4.3x less than fp32), decoded
/// inside the GEMMs (--widen: fp32)".
inline std::string quantized_description(const model_choice& m) {
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  if (!m.info) return "";
  const double p = m.info->quantized_projection_params + m.info->quantized_embedding_params;
  const double b = m.info->quantized_projection_bytes + m.info->quantized_embedding_bytes;
  if (p <= 0) return "";
  const char* what =
      m.info->quantized_embedding_params > 0
          ? (m.info->quantized_projection_params > 0 ? "projections and embeddings" : "embeddings")
          : "projections";
  char line[256];
  if (m.hold_quantized) {
    const bool int8 = m.options.activations == ref::activation_type::int8;
    std::snprintf(line, sizeof line,
                  "%s: %.1fM parameters held as stored (%s, %.1fx less than fp32), %s\n", what,
                  p / 1e6, mib(b).c_str(), 4.0 * p / b,
                  int8 ? "dotted with 8-bit activations where the type allows (--int8-activations)"
                       : "decoded inside the GEMMs (--widen: fp32)");
  } else {
    std::snprintf(line, sizeof line,
                  "%s: %.1fM parameters dequantized to fp32 (--widen: %s, %.1fx the file's %s)\n",
                  what, p / 1e6, mib(4.0 * p).c_str(), 4.0 * p / b, mib(b).c_str());
  }
  return line;
#else
  (void)m;
  return "";
#endif
}

/// "model: 4 layers, hidden 256, ...; f32 weights; 2 threads, onednn GEMMs" ("f32 activations
/// and unquantized tensors" where projections are held quantized) and, for a checkpoint, lines
/// before it naming it and saying how its quantized tensors are held.
inline std::string describe(const model_choice& m) {
  const ref::config& c = m.cfg;
  std::string out;
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  if (m.info) {
    std::string types;
    for (const auto& [t, n] : m.info->tensor_types) {
      types += (types.empty() ? "" : ", ") + t + " x " + std::to_string(n);
    }
    char line[256];
    std::snprintf(line, sizeof line, "%.1fM parameters", m.info->n_params / 1e6);
    out += "checkpoint: " + m.info->name + " (" + m.info->architecture + ", " + m.info->format +
           "), " + line + "; tensors " + types + "\n";
    out += quantized_description(m);
  }
#endif
  const std::string bf16 = bf16_description(m);
  // Projections held as stored (the line above says how): the type names the activations and
  // the tensors not held quantized.
  bool held = false;
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  held = m.info && m.hold_quantized && m.info->quantized_projection_params > 0;
#endif
  out += "model: " + std::to_string(c.n_layers) + " layers, hidden " + std::to_string(c.hidden) +
         ", " + std::to_string(c.n_heads) + " heads / " + std::to_string(c.n_kv_heads) +
         " kv heads x " + std::to_string(c.head_size()) + ", ffn " + std::to_string(c.ffn) +
         ", vocab " + std::to_string(c.vocab) + "; " + ref::weight_type_name(m.options.weights) +
         (held ? " activations and unquantized tensors" : " weights") +
         (bf16.empty() ? "" : " (bf16: " + bf16 + ")") + "; " +
         std::to_string(ref::threads_for(m.threads)) + " threads, " + ref::backend_name(m.backend) +
         " GEMMs";
  if (m.bf16_measured) out += "\n" + bf16_verdict(*m.bf16_measured);
  return out;
}

/// The same as JSON: {"name", "architecture", "format", "params" (checkpoints), "weights",
/// "bf16" and "bf16_speed" (bf16 weights: how it runs, and its speed as a multiple of fp32's,
/// measured), "quantized" ({"projection_params", "projection_file_bytes", "embedding_params",
/// "embedding_file_bytes", "held"}), "vocab", "hidden",
/// "layers", "heads", "kv_heads", "head_dim", "ffn", "rope_theta"}.
inline nlohmann::ordered_json describe_json(const model_choice& m) {
  const ref::config& c = m.cfg;
  nlohmann::ordered_json j;
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  if (m.info) {
    j["name"] = m.info->name;
    j["architecture"] = m.info->architecture;
    j["format"] = m.info->format;
    j["params"] = static_cast<long long>(m.info->n_params);
  }
#endif
  j["weights"] = ref::weight_type_name(m.options.weights);
  if (m.options.weights == ref::weight_type::bf16) j["bf16"] = bf16_description(m);
  if (m.bf16_measured) j["bf16_speed"] = m.bf16_measured->ratio();
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  if (m.info && m.info->quantized_projection_params + m.info->quantized_embedding_params > 0) {
    j["quantized"] = {{"projection_params", m.info->quantized_projection_params},
                      {"projection_file_bytes", m.info->quantized_projection_bytes},
                      {"embedding_params", m.info->quantized_embedding_params},
                      {"embedding_file_bytes", m.info->quantized_embedding_bytes},
                      {"held", m.hold_quantized}};
  }
#endif
  j["vocab"] = c.vocab;
  j["hidden"] = c.hidden;
  j["layers"] = c.n_layers;
  j["heads"] = c.n_heads;
  j["kv_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_size();
  j["ffn"] = c.ffn;
  j["rope_theta"] = c.rope_theta;
  return j;
}

}  // namespace support
