// bench_onednn3: prepack's held quantized rows (reference::linear over Q8_0 / Q4_0 blocks, fp32
// activations) against oneDNN 3.x's matmul with weight decompression on the same weights, side by
// side in one run: the library candidate for multiplying quantized weights without widening them.
//
//   decompress/<type>/<K>x<N>/m<M>/<impl>   one projection of the large model's shapes (gate | up:
//                                           1024 x 5632, down: 2816 x 1024) at M activation rows
//     prepack        linear::apply on the rows as the file stores them (exact: fp32 products)
//     onednn-f32     matmul, s8 (Q8_0) or s4 (Q4_0: q - 8) weights in the layout oneDNN picks,
//                    f32 scales in groups of 32 along K, f32 activations, fpmath strict (f32
//                    products); skipped, saying so, where only oneDNN's reference kernel takes it
//     onednn-bf16    the same with bf16 activations (rounded before the timing) and fpmath bf16:
//                    not exact, the form oneDNN's decompressing kernels take
//
// Counters: weight_gbs (held bytes streamed per second), max_rel_diff (the largest |difference|
// from prepack's output over its largest |value|; the exact forms agree to fp32 rounding).
// Prints a table of prepack / oneDNN time ratios at the end, and the CPU time other processes
// took during the run. Built only with -DPREPACK_ONEDNN3_DIR=<a oneDNN >= 3.5 install> (Debian
// 12's oneDNN 2.6 has no weight decompression); prepack's headers are compiled here without
// their own oneDNN backend, so the two libraries never meet.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "machine.hpp"
#include "oneapi/dnnl/dnnl.hpp"
#include "prepack/numeric.hpp"
#include "prepack/reference/linear.hpp"
#include "prepack/reference/quantized.hpp"
#include "support/main.hpp"

namespace ref = prepack::reference;

namespace {

using prepack::ggml::ggml_type;

// One projection's weights, K x N, as Q8_0 or Q4_0 rows (prepack) and as the s8 / s4 values and
// f32 group scales oneDNN takes (the same numbers: d widened from fp16 exactly).
struct weights {
  ggml_type type;
  long k, n;
  ref::linear rows;
  std::vector<std::int8_t> values;  // [K][N], q (Q8_0) or q - 8 (Q4_0); s4 packed two a byte
  std::vector<float> scales;        // [K / 32][N]
  std::size_t held_bytes = 0;
};

weights make_weights(ggml_type type, long k, long n, std::mt19937& rng) {
  const bool q4 = type == ggml_type::q4_0;
  const long nb = k / 32, bb = q4 ? 18 : 34;
  std::vector<unsigned char> bytes(static_cast<std::size_t>(n * nb * bb));
  std::vector<std::int8_t> v(static_cast<std::size_t>(k * n));
  weights w{type, k, n, {}, {}, std::vector<float>(static_cast<std::size_t>(nb * n)), 0};
  for (long j = 0; j < n; ++j) {
    for (long b = 0; b < nb; ++b) {
      unsigned char* blk = &bytes[static_cast<std::size_t>((j * nb + b) * bb)];
      const std::uint16_t h =
          prepack::half::from_float(0.001f * static_cast<float>(1 + rng() % 50));
      blk[0] = static_cast<unsigned char>(h & 0xFF);
      blk[1] = static_cast<unsigned char>(h >> 8);
      w.scales[static_cast<std::size_t>(b * n + j)] = prepack::half::to_float(h);
      for (int t = 0; t < 32; ++t) {
        const std::size_t at = static_cast<std::size_t>((b * 32 + t) * n + j);
        if (q4) {  // values t < 16 the low nibbles, t >= 16 the high ones
          const int q = static_cast<int>(rng() % 16);
          unsigned char& byte = blk[2 + t % 16];
          byte = static_cast<unsigned char>(t < 16 ? (byte & 0xF0) | q : (byte & 0x0F) | (q << 4));
          v[at] = static_cast<std::int8_t>(q - 8);
        } else {
          const int q = static_cast<int>(rng() % 255) - 127;
          blk[2 + t] = static_cast<unsigned char>(q & 0xFF);
          v[at] = static_cast<std::int8_t>(q);
        }
      }
    }
  }
  w.held_bytes = bytes.size();
  w.rows = ref::linear(std::vector<ref::quantized_matrix>{ref::quantized_matrix::from_bytes(
                           type, n, k, bytes.data(), bytes.size(), "weights")},
                       ref::vector());
  if (q4) {  // s4: two values a byte, the first in the low nibble
    w.values.assign(v.size() / 2, 0);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto nib = static_cast<unsigned>(static_cast<unsigned char>(v[i]) & 0x0F);
      auto& byte = reinterpret_cast<unsigned char&>(w.values[i / 2]);
      byte = static_cast<unsigned char>(byte | (i % 2 ? nib << 4 : nib));
    }
  } else {
    w.values = std::move(v);
  }
  return w;
}

// oneDNN's matmul over w for m rows, fp32 in and out, with `math` (strict: f32 products).
struct onednn_matmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::matmul prim;
  dnnl::memory a, b, c, scales;
  std::string impl;

  // bf16: the activations a_data are taken as bf16 (rounded here, before timing: oneDNN's
  // decompressing kernels take bf16 or f16 sources only) and multiplied with fpmath bf16.
  onednn_matmul(const weights& w, long m, bool bf16, const float* a_data, float* c_data) {
    using dt = dnnl::memory::data_type;
    const dt wt = w.type == ggml_type::q4_0 ? dt::s4 : dt::s8;
    const dnnl::memory::desc a_md({m, w.k}, bf16 ? dt::bf16 : dt::f32, {w.k, 1});
    const dnnl::memory::desc c_md({m, w.n}, dt::f32, {w.n, 1});
    dnnl::primitive_attr attr;
    attr.set_scales(DNNL_ARG_WEIGHTS, (1 << 0) + (1 << 1), {32, 1}, dt::f32);
    attr.set_fpmath_mode(bf16 ? dnnl::fpmath_mode::bf16 : dnnl::fpmath_mode::strict, true);
    // int4 weights stay in the plain layout (oneDNN decompresses s4 from plain or transposed
    // layouts only); int8 ones go into the layout its matmul picks.
    const auto tag =
        w.type == ggml_type::q4_0 ? dnnl::memory::format_tag::ab : dnnl::memory::format_tag::any;
    const dnnl::matmul::primitive_desc pd(eng, a_md, dnnl::memory::desc({w.k, w.n}, wt, tag), c_md,
                                          attr);
    impl = pd.impl_info_str();
    dnnl::memory user({{w.k, w.n}, wt, dnnl::memory::format_tag::ab}, eng,
                      const_cast<std::int8_t*>(w.values.data()));
    if (pd.weights_desc() == user.get_desc()) {
      b = user;
    } else {
      b = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(user, b).execute(st, user, b);
    }
    scales = dnnl::memory({{w.n, w.k / 32}, dt::f32, {1, w.n}}, eng,
                          const_cast<float*>(w.scales.data()));
    a = dnnl::memory(a_md, eng);
    dnnl::memory a_f32({{m, w.k}, dt::f32, {w.k, 1}}, eng, const_cast<float*>(a_data));
    dnnl::reorder(a_f32, a).execute(st, a_f32, a);
    c = dnnl::memory(c_md, eng, c_data);
    prim = dnnl::matmul(pd);
    st.wait();
  }
  void run() {
    prim.execute(st, {{DNNL_ARG_SRC, a},
                      {DNNL_ARG_WEIGHTS, b},
                      {DNNL_ARG_DST, c},
                      {DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, scales}});
    st.wait();
  }
};

struct row {
  double ms = 0, rel_diff = 0;
  std::string impl;
};
// (type, shape, m) -> implementation -> its row
std::map<std::tuple<std::string, std::string, long>, std::map<std::string, row>> g_rows;
machine::cpu_times g_t0;

void register_all() {
  struct shape {
    const char* name;
    long k, n;
  };
  for (const ggml_type type : {ggml_type::q8_0, ggml_type::q4_0}) {
    for (const shape s : {shape{"gate_up", 1024, 5632}, shape{"down", 2816, 1024}}) {
      for (const long m : {1L, 8L, 32L, 512L}) {
        for (const std::string impl : {"prepack", "onednn-f32", "onednn-bf16"}) {
          const std::string tname = prepack::ggml::ggml_type_name(type);
          const std::string name = "decompress/" + tname + "/" + std::to_string(s.k) + "x" +
                                   std::to_string(s.n) + "/m" + std::to_string(m) + "/" + impl;
          benchmark::RegisterBenchmark(
              name.c_str(),
              [=](benchmark::State& state) {
                std::mt19937 rng(7);
                const weights w = make_weights(type, s.k, s.n, rng);
                std::vector<float> a(static_cast<std::size_t>(m * s.k));
                for (auto& v : a) {
                  v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.0f;
                }
                std::vector<float> want(static_cast<std::size_t>(m * s.n)),
                    got(static_cast<std::size_t>(m * s.n));
                ref::gemm_scratch scratch;
                const auto ours = [&](float* out) {
                  w.rows.apply(ref::gemm_backend::eigen, m, a.data(), s.k, out, s.n, false,
                               scratch);
                };
                ours(want.data());
                const int reps = m >= 512 ? 5 : 50;
                row& r = g_rows[{tname, s.name, m}][impl];
                double best = 0;
                if (impl == "prepack") {
                  for (auto _ : state) {
                    best = machine::best_seconds([&] { ours(got.data()); }, reps);
                    state.SetIterationTime(best);
                  }
                  r.impl = "prepack fused / panel";
                } else {
                  try {
                    onednn_matmul mm(w, m, impl == "onednn-bf16", a.data(), got.data());
                    r.impl = mm.impl;
                    if (r.impl.rfind("ref", 0) == 0) {  // minutes a call: not worth timing
                      r.impl = "only its reference kernel (" + r.impl + ")";
                      state.SkipWithError(r.impl.c_str());
                      return;
                    }
                    for (auto _ : state) {
                      best = machine::best_seconds([&] { mm.run(); }, reps);
                      state.SetIterationTime(best);
                    }
                  } catch (const dnnl::error& e) {
                    state.SkipWithError(e.what());
                    r.impl = std::string("refused: ") + e.what();
                    return;
                  }
                }
                double diff = 0, scale = 0;
                for (std::size_t i = 0; i < want.size(); ++i) {
                  diff = std::max(diff, static_cast<double>(std::abs(want[i] - got[i])));
                  scale = std::max(scale, static_cast<double>(std::abs(want[i])));
                }
                r.ms = 1000 * best;
                r.rel_diff = diff / scale;
                state.counters["weight_gbs"] = static_cast<double>(w.held_bytes) / best / 1e9;
                state.counters["max_rel_diff"] = r.rel_diff;
                state.SetLabel(r.impl);
              })
              ->Iterations(1)
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

void print_table() {
  std::printf(
      "\n| type | shape | rows | prepack ms (exact) | oneDNN f32 activations | oneDNN bf16 "
      "activations ms | prepack speed vs it | its max rel diff | its kernel |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [key, impls] : g_rows) {
    const auto get = [&](const char* k) {
      const auto it = impls.find(k);
      return it == impls.end() ? row{} : it->second;
    };
    const row p = get("prepack"), f = get("onednn-f32"), b = get("onednn-bf16");
    char f32[64];
    if (f.ms > 0) {
      std::snprintf(f32, sizeof f32, "%.3f ms (%.2fx)", f.ms, p.ms > 0 ? f.ms / p.ms : 0.0);
    } else {
      std::snprintf(f32, sizeof f32, "%s", f.impl.empty() ? "not run" : f.impl.c_str());
    }
    std::printf("| %s | %s | %ld | %.3f | %s | %.3f | %.2fx | %.1e | %s |\n",
                std::get<0>(key).c_str(), std::get<1>(key).c_str(), std::get<2>(key), p.ms, f32,
                b.ms, p.ms > 0 && b.ms > 0 ? b.ms / p.ms : 0.0, b.rel_diff, b.impl.c_str());
  }
  std::printf("\noneDNN %d.%d.%d; other processes used %.1f%% of the machine's CPU time.\n",
              dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch,
              100 * machine::others_share(g_t0, machine::cpu_times::now()));
}

int run(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  g_t0 = machine::cpu_times::now();
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("bench_onednn3", [&] { return run(argc, argv); });
}
