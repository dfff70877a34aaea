// What the machine can do and what else it did while the benchmark ran: the FMA peak measured by
// a short loop of independent fused multiply-adds on every thread (not assumed from a data
// sheet), and the CPU time other processes took during the run (from /proc/stat), so a report
// says how much of its timing was the machine's.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace machine {

// The shortest of `reps` runs of f, in seconds (steady clock): the one least disturbed by
// whatever else the machine did.
template <class F>
double best_seconds(F&& f, int reps) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// GFLOP/s of `threads` threads doing nothing but independent FMAs for about `seconds`: the
// best of three, each thread with 16 accumulators (enough to hide the FMA latency).
inline double fma_peak_gflops(int threads, double seconds = 0.2) {
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    double total_flops = 0;
    const auto t0 = std::chrono::steady_clock::now();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total_flops)
#endif
    {
      constexpr int acc = 16;
      const long iters = 1 << 16;
      double flops = 0;
      float sink = 0;
      const auto start = std::chrono::steady_clock::now();
      while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
             seconds) {
#if defined(__AVX512F__)
        __m512 a[acc];
        const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-6f);
        for (int k = 0; k < acc; ++k) a[k] = _mm512_set1_ps(static_cast<float>(k));
        for (long i = 0; i < iters; ++i) {
          for (int k = 0; k < acc; ++k) a[k] = _mm512_fmadd_ps(a[k], x, y);
        }
        for (int k = 0; k < acc; ++k) sink += _mm512_reduce_add_ps(a[k]);
        flops += 2.0 * 16 * acc * static_cast<double>(iters);
#elif defined(__FMA__)
        __m256 a[acc];
        const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-6f);
        for (int k = 0; k < acc; ++k) a[k] = _mm256_set1_ps(static_cast<float>(k));
        for (long i = 0; i < iters; ++i) {
          for (int k = 0; k < acc; ++k) a[k] = _mm256_fmadd_ps(a[k], x, y);
        }
        float out[8];
        for (int k = 0; k < acc; ++k) {
          _mm256_storeu_ps(out, a[k]);
          for (float o : out) sink += o;
        }
        flops += 2.0 * 8 * acc * static_cast<double>(iters);
#else
        float a[acc];
        for (int k = 0; k < acc; ++k) a[k] = static_cast<float>(k);
        for (long i = 0; i < iters; ++i) {
          for (int k = 0; k < acc; ++k) a[k] = a[k] * 0.999f + 1e-6f;
        }
        for (float v : a) sink += v;
        flops += 2.0 * acc * static_cast<double>(iters);
#endif
      }
      if (sink == 12345.0f) std::printf(" ");  // keeps the loop
      total_flops += flops;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, total_flops / s / 1e9);
  }
  return best;
}

// GB/s that `threads` threads read from memory: the best of three passes summing a buffer far
// larger than the caches (what a decode step's weight streaming is bounded by). Each thread sums
// into 64 independent lanes, so the adds vectorize without reordering and memory, not the add
// latency, bounds the loop.
inline double read_bandwidth_gbs(int threads, std::size_t bytes = std::size_t{1} << 29) {
  constexpr std::size_t lanes = 64;
  const std::size_t n = bytes / sizeof(float) / lanes * lanes;
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  volatile float sink = 0;
  for (int round = 0; round < 4; ++round) {
    float total = 0;
    const auto t0 = std::chrono::steady_clock::now();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
    {
      float acc[lanes] = {};
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
      for (long i = 0; i < static_cast<long>(n); i += static_cast<long>(lanes)) {
        const float* p = buf.data() + i;
        for (std::size_t k = 0; k < lanes; ++k) acc[k] += p[k];
      }
      for (float a : acc) total += a;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    if (round > 0) best = std::max(best, static_cast<double>(n * sizeof(float)) / s / 1e9);
  }
  (void)sink;
  return best;
}

// CPU seconds of the whole machine (busy, all cores) and of this process, to tell how much of a
// run other processes took.
struct cpu_times {
  double machine_busy = 0, machine_total = 0, self = 0;

  static cpu_times now() {
    cpu_times t;
    std::ifstream stat("/proc/stat");
    std::string cpu;
    long long user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (stat >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal) {
      const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
      t.machine_busy = static_cast<double>(user + nice + sys + irq + softirq + steal) / hz;
      t.machine_total = t.machine_busy + static_cast<double>(idle + iowait) / hz;
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    t.self = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    return t;
  }
};

// Share of the machine's CPU time between `a` and `b` that other processes used (0..1).
inline double others_share(const cpu_times& a, const cpu_times& b) {
  const double total = b.machine_total - a.machine_total;
  if (total <= 0) return 0;
  const double others = (b.machine_busy - a.machine_busy) - (b.self - a.self);
  return std::max(0.0, others / total);
}

}  // namespace machine
