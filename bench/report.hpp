// The benchmark report: results.csv (every measurement), results.md (tables and the targets),
// and gnuplot data + script for the charts (speedup over padding and peak memory vs batch size).
#pragma once

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace report {

struct key {
  std::string model, workload, method;
  std::size_t batch = 0;
  bool operator<(const key& o) const {
    return std::tie(model, workload, method, batch) <
           std::tie(o.model, o.workload, o.method, o.batch);
  }
};

struct row {
  key k;
  double seconds = 0;          // per dataset pass (one benchmark iteration)
  double batches = 0;          // batches per pass
  double useful_tokens = 0;    // per pass
  double computed_tokens = 0;  // token rows computed per pass (pad slots included; a shared
                               // prefix once)
  double slots = 0;            // slots computed per pass
  double peak_bytes = 0;       // largest single prefill (or pool + largest step)
  double peak_slots = 0;       // slots of that prefill
  double linear_gflops = 0, fma_peak = 0, attention_share = 0, max_diff = 0;
  double ttft_p50 = 0, ttft_p99 = 0;  // seconds
  double steps = 0, steps_lower_bound = 0;
};

struct kernel_row {
  std::string model, workload, backend, weights;
  std::string bf16_path;  // bf16 weights: "native (avx512_core_bf16)", "emulated on avx2", ...
  double seconds = 0, tokens_per_s = 0, linear_gflops = 0, fma_peak = 0, attention_share = 0;
  double max_diff = 0;
};

struct table {
  std::map<std::string, row> pending;  // by benchmark name, until its time is known
  std::map<std::string, kernel_row> pending_kernel;
  std::vector<row> rows;
  std::vector<kernel_row> kernel_rows;
  double others_share = 0, fma_peak = 0;
  int threads = 0;
  std::vector<std::string> checkpoints;  // "name: loaded in S s (params, tensor types)"
  std::vector<std::string> bf16_here;    // per backend: "bf16 runs at 0.58x fp32's speed ..."
};

inline void write(const table& t, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  std::map<key, row> by;
  std::vector<std::string> models, methods;  // in order of first appearance
  std::set<std::string> workloads, prefix_workloads;
  std::set<std::size_t> batches;
  for (const row& r : t.rows) {
    by[r.k] = r;
    if (std::find(models.begin(), models.end(), r.k.model) == models.end())
      models.push_back(r.k.model);
    if (std::find(methods.begin(), methods.end(), r.k.method) == methods.end())
      methods.push_back(r.k.method);
    workloads.insert(r.k.workload);
    if (r.k.method == "prefix") prefix_workloads.insert(r.k.workload);
    batches.insert(r.k.batch);
  }
  const auto get = [&](const std::string& m, const std::string& w, const std::string& me,
                       std::size_t b) -> const row* {
    const auto it = by.find({m, w, me, b});
    return it == by.end() ? nullptr : &it->second;
  };
  std::string budget_small, budget_large;  // the two budget methods, by size
  for (const auto& me : methods) {
    if (me.rfind("budget-", 0) != 0) continue;
    if (budget_small.empty() || std::stoul(me.substr(7)) < std::stoul(budget_small.substr(7))) {
      if (!budget_small.empty()) budget_large = budget_small;
      budget_small = me;
    } else {
      budget_large = me;
    }
  }

  std::ofstream csv(dir + "/results.csv");
  csv << "model,workload,method,batch,seconds_per_batch,useful_tokens_per_s,padded_ratio,"
         "computed_ratio,speedup_over_padding,peak_bytes,memory_ratio_padding_over_method,"
         "linear_gflops,fma_peak_gflops,attention_share,ttft_p50_s,ttft_p99_s,steps,"
         "steps_lower_bound,max_abs_diff_logits\n";
  for (const auto& [k, r] : by) {
    const row* pad = get(k.model, k.workload, "padding", k.batch);
    csv << k.model << ',' << k.workload << ',' << k.method << ',' << k.batch << ','
        << r.seconds / r.batches << ',' << r.useful_tokens / r.seconds << ','
        << r.slots / r.useful_tokens << ',' << r.computed_tokens / r.useful_tokens << ','
        << (pad ? pad->seconds / r.seconds : 0) << ',' << r.peak_bytes << ','
        << (pad ? pad->peak_bytes / r.peak_bytes : 0) << ',' << r.linear_gflops << ',' << r.fma_peak
        << ',' << r.attention_share << ',' << r.ttft_p50 << ',' << r.ttft_p99 << ',' << r.steps
        << ',' << r.steps_lower_bound << ',' << r.max_diff << '\n';
  }
  std::ofstream kcsv(dir + "/kernel.csv");
  kcsv << "model,workload,backend,weights,bf16_path,seconds,tokens_per_s,linear_gflops,"
          "fma_peak_gflops,peak_share,attention_share,max_abs_diff_logits\n";
  for (const kernel_row& k : t.kernel_rows) {
    kcsv << k.model << ',' << k.workload << ',' << k.backend << ',' << k.weights << ','
         << k.bf16_path << ',' << k.seconds << ',' << k.tokens_per_s << ',' << k.linear_gflops
         << ',' << k.fma_peak << ',' << k.linear_gflops / k.fma_peak << ',' << k.attention_share
         << ',' << k.max_diff << '\n';
  }

  std::ofstream md(dir + "/results.md");
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "Run on %d threads; FMA peak measured by the benchmark: %.1f GFLOP/s; other "
                "processes used %.1f%% of the machine's CPU time during the run.\n\n",
                t.threads, t.fma_peak, 100.0 * t.others_share);
  md << buf;
  for (const std::string& c : t.checkpoints) md << "Checkpoint " << c << ".\n\n";
  for (const std::string& b : t.bf16_here) md << b << ".\n\n";
  for (const std::string& m : models) {
    md << "### Model `" << m << "`: speedup over padding (time per batch, same run)\n\n";
    md << "| workload | batch | padding s/batch | padded ratio |";
    std::vector<std::string> cols;
    for (const auto& me : methods) {
      if (me != "padding" && me != "prefix") cols.push_back(me);
    }
    for (const auto& me : cols) md << ' ' << me << " |";
    md << " memory padding / ffd-fit | memory padding / " << budget_small
       << " |\n|---|---|---|---|";
    for (std::size_t i = 0; i < cols.size() + 2; ++i) md << "---|";
    md << "\n";
    for (const std::string& w : workloads) {
      if (prefix_workloads.count(w)) continue;
      for (std::size_t b : batches) {
        const row* pad = get(m, w, "padding", b);
        if (!pad) continue;
        std::snprintf(buf, sizeof buf, "| %s | %zu | %.4f | %.2f |", w.c_str(), b,
                      pad->seconds / pad->batches, pad->slots / pad->useful_tokens);
        md << buf;
        for (const auto& me : cols) {
          const row* r = get(m, w, me, b);
          std::snprintf(buf, sizeof buf, r ? " %.2fx |" : " - |",
                        r ? pad->seconds / r->seconds : 0);
          md << buf;
        }
        for (const std::string& me : {std::string("ffd-fit"), budget_small}) {
          const row* r = get(m, w, me, b);
          std::snprintf(buf, sizeof buf, " %.2fx |", r ? pad->peak_bytes / r->peak_bytes : 0.0);
          md << buf;
        }
        md << "\n";
      }
    }
    md << "\n";
    // Time to first token: where budgeted steps trade it for throughput.
    md << "Time to first token of model `" << m
       << "` (ms, p50 / p99 over the dataset's prompts, from the pass's start):\n\n| workload | "
          "batch |";
    const std::vector<std::string> tcols{"padding", "ffd-segment", "ffd-fit",
                                         "flat",    budget_small,  budget_large};
    for (const auto& me : tcols) md << ' ' << me << " |";
    md << "\n|---|---|";
    for (std::size_t i = 0; i < tcols.size(); ++i) md << "---|";
    md << "\n";
    for (const std::string& w : workloads) {
      if (prefix_workloads.count(w)) continue;
      for (std::size_t b : batches) {
        if (!get(m, w, "padding", b)) continue;
        md << "| " << w << " | " << b << " |";
        for (const auto& me : tcols) {
          const row* r = get(m, w, me, b);
          std::snprintf(buf, sizeof buf, r ? " %.0f / %.0f |" : " - |", r ? 1e3 * r->ttft_p50 : 0,
                        r ? 1e3 * r->ttft_p99 : 0);
          md << buf;
        }
        md << "\n";
      }
    }
    md << "\n";
    // Shared prefixes.
    if (!prefix_workloads.empty()) {
      md << "Shared prefixes, model `" << m
         << "`: prefix-aware packing against padding and plain prepacking (ffd-segment), and "
            "against the flat limit recomputed for the tokens it computes:\n\n"
            "| workload | batch | computed / useful tokens | speedup over padding | over "
            "ffd-segment | time / (flat x computed / useful) | memory padding / prefix | memory "
            "ffd-segment / prefix | TTFT p50 / p99 ms |\n|---|---|---|---|---|---|---|---|---|\n";
      for (const std::string& w : prefix_workloads) {
        for (std::size_t b : batches) {
          const row* pre = get(m, w, "prefix", b);
          const row* pad = get(m, w, "padding", b);
          const row* seg = get(m, w, "ffd-segment", b);
          const row* flat = get(m, w, "flat", b);
          if (!pre || !pad || !seg || !flat) continue;
          const double flat_computed = flat->seconds * pre->computed_tokens / pre->useful_tokens;
          std::snprintf(
              buf, sizeof buf,
              "| %s | %zu | %.3f | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.0f / %.0f |\n",
              w.c_str(), b, pre->computed_tokens / pre->useful_tokens, pad->seconds / pre->seconds,
              seg->seconds / pre->seconds, pre->seconds / flat_computed,
              pad->peak_bytes / pre->peak_bytes, seg->peak_bytes / pre->peak_bytes,
              1e3 * pre->ttft_p50, 1e3 * pre->ttft_p99);
          md << buf;
        }
      }
      md << "\n";
    }
  }

  // Budgeted steps against their lower bound.
  md << "Budgeted steps: steps used / the lower bound ceil(tokens / budget), summed over a "
        "dataset pass (every step filled: equal by construction).\n\n| model | workload | batch |";
  for (const auto& me : {budget_small, budget_large}) md << ' ' << me << " |";
  md << "\n|---|---|---|---|---|\n";
  for (const std::string& m : models) {
    for (const std::string& w : workloads) {
      for (std::size_t b : batches) {
        const row* r1 = get(m, w, budget_small, b);
        const row* r2 = get(m, w, budget_large, b);
        if (!r1 || !r2 || b != *batches.rbegin()) continue;
        std::snprintf(buf, sizeof buf, "| %s | %s | %zu | %.0f / %.0f | %.0f / %.0f |\n", m.c_str(),
                      w.c_str(), b, r1->steps, r1->steps_lower_bound, r2->steps,
                      r2->steps_lower_bound);
        md << buf;
      }
    }
  }
  md << "\n";

  // The kernel family.
  if (!t.kernel_rows.empty()) {
    md << "### Kernel: prefill tokens/s per GEMM backend and weight type (packed, segment "
          "attention, same run)\n\n| model | workload | backend | weights | tokens/s | vs eigen "
          "f32 | linear GFLOP/s | share of FMA peak | attention share of time |\n"
          "|---|---|---|---|---|---|---|---|---|\n";
    for (const kernel_row& k : t.kernel_rows) {
      double base = 0;
      for (const kernel_row& o : t.kernel_rows) {
        if (o.model == k.model && o.workload == k.workload && o.backend == "eigen" &&
            o.weights == "f32")
          base = o.tokens_per_s;
      }
      const std::string weights =
          k.bf16_path.empty() ? k.weights : k.weights + " (" + k.bf16_path + ")";
      std::snprintf(buf, sizeof buf,
                    "| %s | %s | %s | %s | %.0f | %.2fx | %.0f | %.0f%% | %.1f%% |\n",
                    k.model.c_str(), k.workload.c_str(), k.backend.c_str(), weights.c_str(),
                    k.tokens_per_s, base > 0 ? k.tokens_per_s / base : 0, k.linear_gflops,
                    100.0 * k.linear_gflops / k.fma_peak, 100.0 * k.attention_share);
      md << buf;
    }
    md << "\n";
  }

  // The targets, read off the measurements above.
  md << "### Targets\n\n| target | measured | verdict |\n|---|---|---|\n";
  const auto verdict = [&](const std::string& what, const std::string& measured, bool ok) {
    md << "| " << what << " | " << measured << " | " << (ok ? "met" : "**missed**") << " |\n";
  };
  const std::vector<std::string> judged{"ffd-segment", "ffd-fit"};
  for (const std::string& m : models) {
    for (const std::string& me : judged) {
      const row* pad = get(m, "heavy", "padding", 32);
      const row* seg = get(m, "heavy", me, 32);
      if (!pad || !seg) continue;
      const double speed = pad->seconds / seg->seconds, ratio = pad->slots / pad->useful_tokens;
      std::snprintf(buf, sizeof buf, "speedup %.2fx vs padded ratio %.2fx: %.2f of it", speed,
                    ratio, speed / ratio);
      verdict(m + ": heavy, batch 32: " + me + " speedup >= 0.9 x padding's padded-token ratio",
              buf, speed >= 0.9 * ratio);
    }
    for (const std::string& me : judged) {
      double worst_flat = 0, worst_mem = 0, worst_equal = 0;
      double slots_flat = 0, slots_mem = 0;
      std::string at_flat, at_mem, at_equal;
      for (const std::string& w : workloads) {
        if (prefix_workloads.count(w)) continue;
        for (std::size_t b : batches) {
          const row* seg = get(m, w, me, b);
          const row* flat = get(m, w, "flat", b);
          const row* pad = get(m, w, "padding", b);
          if (seg && flat) {
            if (seg->seconds / flat->seconds > worst_flat) {
              worst_flat = seg->seconds / flat->seconds;
              slots_flat = seg->slots / flat->slots;
              at_flat = w + "/" + std::to_string(b);
            }
            if (seg->peak_bytes / flat->peak_bytes > worst_mem) {
              worst_mem = seg->peak_bytes / flat->peak_bytes;
              slots_mem = seg->peak_slots / flat->peak_slots;
              at_mem = w + "/" + std::to_string(b);
            }
          }
          if (w == "equal" && seg && pad && seg->seconds / pad->seconds > worst_equal) {
            worst_equal = seg->seconds / pad->seconds;
            at_equal = std::to_string(b);
          }
        }
      }
      std::snprintf(buf, sizeof buf, "worst %.3fx (%s); its slots are %.3fx flat's", worst_flat,
                    at_flat.c_str(), slots_flat);
      verdict(m + ": " + me + " time within 1.10x of flat, every workload and batch", buf,
              worst_flat <= 1.10);
      std::snprintf(buf, sizeof buf, "worst %.3fx (%s); its slots are %.3fx flat's", worst_mem,
                    at_mem.c_str(), slots_mem);
      verdict(m + ": " + me + " peak memory within 1.15x of flat", buf, worst_mem <= 1.15);
      std::snprintf(buf, sizeof buf, "worst %.3fx (batch %s)", worst_equal, at_equal.c_str());
      verdict(m + ": equal lengths: " + me + " at most 3% slower than padding", buf,
              worst_equal <= 1.03);
    }
  }
  for (const kernel_row& k : t.kernel_rows) {
    if (k.weights != "f32" || k.backend == "eigen") continue;
    std::snprintf(buf, sizeof buf, "%.0f%% (%.0f of %.0f GFLOP/s)",
                  100.0 * k.linear_gflops / k.fma_peak, k.linear_gflops, k.fma_peak);
    verdict(
        k.model + ", " + k.workload + ", " + k.backend + ": linear layers >= 80% of the FMA peak",
        buf, k.linear_gflops >= 0.8 * k.fma_peak);
    for (const kernel_row& e : t.kernel_rows) {
      if (e.model == k.model && e.workload == k.workload && e.backend == "eigen" &&
          e.weights == "f32") {
        std::snprintf(buf, sizeof buf, "%.2fx (%.0f vs %.0f tokens/s)",
                      k.tokens_per_s / e.tokens_per_s, k.tokens_per_s, e.tokens_per_s);
        verdict(k.model + ", " + k.workload + ": " + k.backend + " tokens/s >= 1.4x the Eigen path",
                buf, k.tokens_per_s >= 1.4 * e.tokens_per_s);
      }
    }
    std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * k.attention_share);
    verdict(k.model + ", " + k.workload + ", " + k.backend + ": attention <= 15% of prefill time",
            buf, k.attention_share <= 0.15);
    for (const kernel_row& b : t.kernel_rows) {
      if (b.model == k.model && b.workload == k.workload && b.backend == k.backend &&
          b.weights == "bf16") {
        std::snprintf(buf, sizeof buf, "%.2fx (%.0f vs %.0f tokens/s), bf16 %s",
                      b.tokens_per_s / k.tokens_per_s, b.tokens_per_s, k.tokens_per_s,
                      b.bf16_path.c_str());
        const std::string what =
            k.model + ", " + k.workload + ": bf16 weights >= 1.6x fp32 tokens/s";
        if (b.bf16_path.rfind("native", 0) == 0) {
          verdict(what, buf, b.tokens_per_s >= 1.6 * k.tokens_per_s);
        } else {  // fp32 GEMMs over bf16-rounded values: no bf16 speed-up to measure here
          md << "| " << what << " | " << buf
             << " | not applicable: this CPU has no bf16 matmul |\n";
        }
      }
    }
  }
  // The run's own noise: on equal lengths these methods run one and the same plan and path, so
  // the spread of their times is what the machine adds, not a difference between methods.
  md << "\n";
  for (const std::string& m : models) {
    double spread = 0;
    std::size_t at = 0;
    for (std::size_t b : batches) {
      double lo = 0, hi = 0;
      for (const char* me : {"ffd-segment", "bfd-segment", "ffd-fit"}) {
        const row* r = get(m, "equal", me, b);
        if (!r) continue;
        lo = lo == 0 ? r->seconds : std::min(lo, r->seconds);
        hi = std::max(hi, r->seconds);
      }
      if (lo > 0 && hi / lo > spread) {
        spread = hi / lo;
        at = b;
      }
    }
    if (spread > 0) {
      std::snprintf(buf, sizeof buf,
                    "Noise of this run, model %s: on `equal` ffd-segment, bfd-segment and ffd-fit "
                    "run the same plan, and their times differ by up to %.1f%% (batch %zu); a "
                    "ratio that far from its limit is not a measured difference.\n",
                    m.c_str(), 100.0 * (spread - 1.0), at);
      md << buf;
    }
  }
  md << "\nSlots are what a row-based plan computes: n_rows x the row width; budgeted steps and "
        "prefix-aware steps compute no pad slot. ffd-segment's rows are as wide as the batch's "
        "longest prompt (the paper's plan): where a batch cannot fill them it computes and holds "
        "pad slots that the flat limit does not. ffd-fit widens the rows until pad slots are at "
        "most 5% of the tokens (prepack::fitted_plan), which segment attention does not pay for. "
        "Budgeted steps hold a paged pool for the batch's KV and one step's activations.\n\n";

  // Chart data: one file per (model, workload), a column per method.
  std::ofstream gp(dir + "/plots.gp");
  gp << "set terminal pngcairo size 1500,900 font 'sans,10'\nset key top left\nset logscale x 2\n"
        "set xlabel 'batch size'\nset grid\n";
  std::vector<std::string> chart_workloads;
  for (const auto& w : workloads) {
    if (!prefix_workloads.count(w)) chart_workloads.push_back(w);
  }
  for (const std::string& m : models) {
    for (const std::string& w : chart_workloads) {
      std::ofstream dat(dir + "/" + m + "_" + w + ".dat");
      dat << "# batch padded_ratio";
      for (const auto& me : methods) dat << " speedup_" << me;
      for (const auto& me : methods) dat << " peakMiB_" << me;
      dat << "\n";
      for (std::size_t b : batches) {
        const row* pad = get(m, w, "padding", b);
        if (!pad) continue;
        dat << b << ' ' << pad->slots / pad->useful_tokens;
        for (const auto& me : methods) {
          const row* r = get(m, w, me, b);
          dat << ' ' << (r ? pad->seconds / r->seconds : 0);
        }
        for (const auto& me : methods) {
          const row* r = get(m, w, me, b);
          dat << ' ' << (r ? r->peak_bytes / (1024.0 * 1024.0) : 0);
        }
        dat << "\n";
      }
    }
    for (int chart = 0; chart < 2; ++chart) {
      const bool speed = chart == 0;
      gp << "set output '" << m << (speed ? "_speedup" : "_memory") << ".png'\n";
      gp << "set multiplot layout 2,3 title 'model " << m
         << (speed ? ": speedup over padding (padding time / method time)"
                   : ": peak memory of one prefill (MiB)")
         << "'\n";
      gp << (speed ? "unset logscale y\nset ylabel 'speedup'\n"
                   : "set logscale y\nset ylabel 'MiB'\n");
      for (const std::string& w : chart_workloads) {
        gp << "set title '" << w << "'\nplot ";
        bool first = true;
        for (std::size_t i = 0; i < methods.size(); ++i) {
          if ((speed && methods[i] == "padding") || methods[i] == "prefix") continue;
          const std::size_t col = 3 + i + (speed ? 0 : methods.size());
          gp << (first ? "" : ", ") << "'" << m << "_" << w << ".dat' using 1:" << col
             << " with linespoints title '" << methods[i] << "'";
          first = false;
        }
        if (speed)
          gp << ", '" << m << "_" << w
             << ".dat' using 1:2 with lines dashtype 2 lc 'black' title 'padded ratio'";
        gp << "\n";
      }
      gp << "unset multiplot\n";
    }
  }
}

}  // namespace report
