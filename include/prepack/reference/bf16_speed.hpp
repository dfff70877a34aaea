// prepack/reference/bf16_speed.hpp - whether bf16 weights are faster or slower than fp32 on
// this CPU, measured rather than assumed. bf16 halves the projections' memory everywhere, but its
// speed depends on the CPU: oneDNN's bf16 matmul ran prefill 1.69x faster than fp32 on a Zen 5
// and 1.72x slower on an AVX512-BF16 Xeon without AMX; where no bf16 matmul runs it is emulated
// (fp32 GEMMs over widened weights), slower than fp32. So the demo, the benchmarks and the memory
// refusal report this measurement beside any advice to use bf16.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../error.hpp"
#include "gemm.hpp"
#include "linear.hpp"
#include "matrix.hpp"
#include "workspace.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// One fp32 and one bf16 layer of the same shape timed side by side on this CPU.
struct bf16_speed {
  bf16_support path;  // how bf16 ran: oneDNN's bf16 matmul, or emulated
  Eigen::Index rows = 0, in = 0, out = 0;
  int threads = 0;
  double f32_seconds = 0, bf16_seconds = 0;  // the fastest of the repeats, one GEMM each

  /// bf16's speed as a multiple of fp32's: above 1 faster, below 1 slower.
  double ratio() const noexcept { return bf16_seconds > 0 ? f32_seconds / bf16_seconds : 0.0; }
  bool faster() const noexcept { return ratio() > 1.0; }
  /// "bf16 runs at 0.58x fp32's speed here (native (avx512_core_bf16); a 128 x 1024 x 2816 GEMM
  /// on 2 threads, measured now)".
  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "bf16 runs at %.2fx fp32's speed here (%s; a %lld x %lld x %lld GEMM on %d "
                  "thread%s, measured now)",
                  ratio(), path.describe().c_str(), static_cast<long long>(rows),
                  static_cast<long long>(in), static_cast<long long>(out), threads,
                  threads == 1 ? "" : "s");
    return buf;
  }
};

/// Times rows x in activations through an in x out layer of fp32 and of bf16 weights, laid out
/// and multiplied on backend `b` as the model does (linear::apply), alternating fp32 and bf16
/// `repeats` times after one warm-up each and keeping each one's fastest: timings on a shared
/// machine are only comparable side by side. Cost: 2 (repeats + 1) GEMMs of 2 rows in out FLOPs
/// each, and in out x 6 bytes of weights plus (rows x (in + out)) x 4 of activations, freed on
/// return. Throws prepack::error naming a non-positive shape or repeat count, n_threads < 0, or a
/// backend this build lacks.
inline bf16_speed measure_bf16_speed(gemm_backend b, Eigen::Index rows, Eigen::Index in,
                                     Eigen::Index out, int n_threads = 0, int repeats = 3) {
  using prepack::detail::require;
  require(rows > 0 && in > 0 && out > 0, "measure_bf16_speed: shape ", rows, " x ", in, " x ", out,
          " (every extent must be positive)");
  require(repeats > 0, "measure_bf16_speed: repeats ", repeats);
  const gemm_backend be = resolve(b);
  const detail::thread_scope scope(n_threads);
  bf16_speed s;
  s.path = bf16_path(be);
  s.rows = rows;
  s.in = in;
  s.out = out;
  s.threads = scope.n();
  // Values of a unit scale from a fixed sequence: the speed does not depend on them.
  std::uint32_t state = 0x9e3779b9u;
  const auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  };
  matrix w(in, out);
  for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = next();
  std::vector<float> a(static_cast<std::size_t>(rows * in)),
      c(static_cast<std::size_t>(rows * out));
  for (float& v : a) v = next();
  const linear f32(w, false, weight_type::f32, be);
  const linear b16(std::move(w), false, weight_type::bf16, be);
  gemm_scratch scratch;
  const auto time = [&](const linear& l) {
    const auto t0 = std::chrono::steady_clock::now();
    l.apply(be, rows, a.data(), in, c.data(), out, false, scratch);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  (void)time(f32);
  (void)time(b16);
  s.f32_seconds = s.bf16_seconds = 1e300;
  for (int r = 0; r < repeats; ++r) {
    s.f32_seconds = std::min(s.f32_seconds, time(f32));
    s.bf16_seconds = std::min(s.bf16_seconds, time(b16));
  }
  return s;
}

}  // namespace reference
PREPACK_NAMESPACE_END
