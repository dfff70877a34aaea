// prepack_plan: size a dataset before running anything. Reads prompt lengths, plans them with
// first-fit-decreasing and best-fit-decreasing, and prints where every prompt goes and the
// padding it saves over padding every prompt to the longest.
//
//   prepack_plan --lengths FILE            lengths separated by spaces, commas or newlines
//   seq 1 100 | prepack_plan --format csv  reads stdin when --lengths is absent or '-'
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "prepack/prepack.hpp"
#include "support/cli.hpp"
#include "support/workload.hpp"

namespace {

struct named_plan {
  const char* name;
  prepack::pack_plan<long long> plan;
};

// What the flags ask for.
struct options {
  std::string lengths = "-";
  std::optional<long long> capacity;
  support::plan_flags plan;
  std::string packer = "both", format = "summary";
};

// The options of the command line; nothing when --help was asked for.
std::optional<options> parse(int argc, char** argv) {
  options o;
  CLI::App app{"", "prepack_plan"};
  support::configure(app, "prepack_plan - plan prompt lengths into packed rows",
                     "Exit codes: 0 ok; 2 bad flags or input.");
  app.add_option("--lengths", o.lengths,
                 "prompt lengths, separated by spaces, commas or newlines ('#' comments);\n"
                 "'-' or absent: standard input")
      ->check(support::text())
      ->type_name("FILE");
  app.add_option("--capacity", o.capacity,
                 "tokens per row (default: the longest prompt); with --max-pad, the\n"
                 "widest row allowed")
      ->check(support::integer(1, 1ll << 40))
      ->type_name("N");
  support::add_max_pad(app, o.plan,
                       "widen rows past the longest prompt until pad slots are at most\n"
                       "F x the tokens (0.05: 5%), as narrow as that allows (fitted_plan)");
  const std::vector<std::string> packers{"ffd", "bfd", "both"}, formats{"summary", "json", "csv"};
  app.add_option("--packer", o.packer, "which planner(s) to run (default both)")
      ->check(support::one_of(packers))
      ->type_name(support::choices(packers));
  app.add_option("--format", o.format,
                 "summary (default): totals per planner; json: totals and every row;\n"
                 "csv: one line per prompt (packer,prompt,length,row,offset)")
      ->check(support::one_of(formats))
      ->type_name(support::choices(formats));
  if (!support::parse(app, argc, argv)) return std::nullopt;
  return o;
}

int run(int argc, char** argv) {
  const std::optional<options> parsed = parse(argc, argv);
  if (!parsed) return 0;
  const options& o = *parsed;
  const std::string& which = o.packer;
  const std::string& format = o.format;
  const std::string& file = o.lengths;

  std::ifstream f;
  if (file != "-") {
    f.open(file);
    if (!f) throw support::usage_error("cannot open '" + file + "'");
  }
  std::istream& in = file == "-" ? std::cin : f;
  const std::string source = file == "-" ? "<stdin>" : file;
  std::vector<long long> len;
  for (const auto& rec : support::read_records(in, source, "length", 1ll << 40)) {
    for (long long v : rec.values) {
      if (v == 0) {
        throw prepack::error(source + ":" + std::to_string(rec.line) + ": prompt " +
                             std::to_string(len.size()) + ": length 0");
      }
      len.push_back(v);
    }
  }
  const std::optional<long long> capacity = o.capacity;
  std::vector<named_plan> plans;
  for (const auto& [name, kind] : {std::pair{"ffd", prepack::packer::first_fit_decreasing},
                                   std::pair{"bfd", prepack::packer::best_fit_decreasing}}) {
    if (which == "both" || which == name) {
      plans.push_back({name, support::plan_from_flags(o.plan, kind, len, capacity)});
    }
  }

  long long longest = 0;
  for (long long v : len) longest = std::max(longest, v);
  const double useful = static_cast<double>(plans.front().plan.useful_tokens());
  const double padded = static_cast<double>(len.size()) * static_cast<double>(longest);

  if (format == "csv") {
    std::printf("packer,prompt,length,row,offset\n");
    for (const auto& p : plans) {
      for (std::size_t i = 0; i < len.size(); ++i) {
        std::printf("%s,%zu,%lld,%zu,%lld\n", p.name, i, len[i], p.plan.row[i], p.plan.offset[i]);
      }
    }
    return 0;
  }
  if (format == "json") {
    nlohmann::ordered_json j;
    j["n_prompts"] = len.size();
    j["useful_tokens"] = plans.front().plan.useful_tokens();
    j["longest"] = longest;
    j["padded_slots"] = len.size() * static_cast<std::size_t>(longest);
    for (const auto& np : plans) {
      const auto& p = np.plan;
      nlohmann::ordered_json pj;
      pj["capacity"] = p.capacity;
      pj["n_rows"] = p.n_rows();
      pj["slots"] = p.slots();
      pj["fill"] = useful / static_cast<double>(p.slots());
      pj["padded_over_packed"] = padded / static_cast<double>(p.slots());
      pj["rows"] = nlohmann::ordered_json::array();
      for (std::size_t r = 0; r < p.n_rows(); ++r) {
        nlohmann::ordered_json row;
        row["fill"] = p.fill[r];
        row["prompts"] = nlohmann::ordered_json::array();
        for (std::size_t k = p.row_begin[r]; k < p.row_begin[r + 1]; ++k) {
          const std::size_t i = p.row_prompts[k];
          row["prompts"].push_back({i, p.offset[i], p.length[i]});
        }
        pj["rows"].push_back(std::move(row));
      }
      j["plans"][np.name] = std::move(pj);
    }
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::printf("%zu prompts, %.0f tokens, longest %lld\n", len.size(), useful, longest);
  std::printf("padding to the longest: %.0f slots (%.2fx the tokens)\n", padded, padded / useful);
  for (const auto& p : plans) {
    std::printf(
        "%s: capacity %lld, %zu rows, %zu slots (%.2fx the tokens, fill %.1f%%), %.2fx fewer slots "
        "than padding\n",
        p.name, p.plan.capacity, p.plan.n_rows(), p.plan.slots(),
        static_cast<double>(p.plan.slots()) / useful,
        100.0 * useful / static_cast<double>(p.plan.slots()),
        padded / static_cast<double>(p.plan.slots()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("prepack_plan", [&] { return run(argc, argv); });
}
