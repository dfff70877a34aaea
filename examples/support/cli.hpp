// support/cli.hpp - the example binaries' command lines, on CLI11: the conventions they share
// (long flags only, a later repeat overrides an earlier one, --help generated from the options)
// and validators that check every value as the text it was given, before CLI11 converts it, so
// each mistake is one line naming the flag and the value: "--batch: 0 outside 1..100000",
// "--heads: 'four' is not an integer", "--packer: 'nfd' is not one of ffd|bfd",
// "--capacity: needs a value (before '--batch')".
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "prepack/plan.hpp"
#include "support/main.hpp"

namespace support {

namespace detail {

// "" for a value, else why the text is a forgotten value: the next flag ("--capacity --batch 3").
inline std::string forgotten_value(const std::string& s) {
  if (s.rfind("--", 0) == 0) return "needs a value (before '" + s + "')";
  return {};
}

inline std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace detail

/// An integer in [lo, hi], written in decimal digits (an optional sign; nothing else).
inline CLI::Validator integer(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        if (auto why = detail::forgotten_value(s); !why.empty()) return why;
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno == ERANGE) return "'" + s + "' is not an integer";
        if (v < lo || v > hi) {
          return s + " outside " + std::to_string(lo) + ".." + std::to_string(hi);
        }
        return {};
      },
      "", "integer");
}

/// A finite number in [lo, hi].
inline CLI::Validator real(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        if (auto why = detail::forgotten_value(s); !why.empty()) return why;
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) {
          return "'" + s + "' is not a number in [" + detail::number_text(lo) + ", " +
                 detail::number_text(hi) + "]";
        }
        return {};
      },
      "", "real");
}

/// One of `options`, spelled exactly.
inline std::string choices(const std::vector<std::string>& options);
inline CLI::Validator one_of(std::vector<std::string> options) {
  std::string list = choices(options);
  return CLI::Validator(
      [options = std::move(options), list](std::string& s) -> std::string {
        if (auto why = detail::forgotten_value(s); !why.empty()) return why;
        for (const auto& o : options) {
          if (o == s) return {};
        }
        return "'" + s + "' is not one of " + list;
      },
      "", "one_of");
}

/// Any text (a path, a name) but the next flag.
inline CLI::Validator text() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty()) return "needs a value";
        return detail::forgotten_value(s);
      },
      "", "text");
}

/// The values a choice flag takes, as its help shows them: "ffd|bfd".
inline std::string choices(const std::vector<std::string>& options) {
  std::string list;
  for (const auto& o : options) list += (list.empty() ? "" : "|") + o;
  return list;
}

/// --help's layout: each group under its heading, one blank line between groups, and an option
/// as its name, its value's name and its description (CLI11's default also lists, beside the
/// name, the options it excludes; the binaries say that in the description where it matters).
class help_formatter : public CLI::Formatter {
 public:
  std::string make_group(std::string group, bool is_positional,
                         std::vector<const CLI::Option*> opts) const override {
    std::string out = group + ":\n";
    for (const CLI::Option* opt : opts) out += make_option(opt, is_positional);
    return out;
  }
  std::string make_usage(const CLI::App* app, std::string name) const override {
    return CLI::Formatter::make_usage(app, std::move(name)) + "\n";
  }
  std::string make_positionals(const CLI::App* app) const override {
    std::string out = CLI::Formatter::make_positionals(app);
    return out.empty() ? out : out + "\n";
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_type_size() != 0 && !opt->get_type_name().empty() ? " " + opt->get_type_name()
                                                                      : std::string();
  }
};

/// An application with the binaries' conventions: `intro` heads --help, `footer` ends it.
/// Options are added with CLI11's add_option / add_flag, each with a validator above and its
/// value's name (type_name), grouped with ->group("heading").
inline void configure(CLI::App& app, const std::string& intro, const std::string& footer) {
  app.description(intro);
  app.footer(footer);
  app.set_help_flag("--help", "print this help and exit");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.option_defaults()->disable_flag_override();
  auto formatter = std::make_shared<help_formatter>();
  formatter->column_width(22);
  app.formatter(formatter);
}

/// Parses the command line: true to go on, false when --help was printed (exit 0). Every other
/// CLI11 error becomes a usage_error of one line (the binary exits with code 2).
inline bool parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  } catch (const CLI::ExtrasError& e) {
    const auto extras = app.remaining();
    if (extras.empty()) throw usage_error(e.what());
    const std::string& a = extras.front();
    throw usage_error((a.rfind("--", 0) == 0 ? "unknown flag '" : "unexpected argument '") + a +
                      "' (try --help)");
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11's words for two mistakes, in ours: "--capacity: 1 required N missing" (the value
    // left off at the end of the line) and "json was given a disallowed flag override"
    // (--json=1: a switch given a value).
    const std::string what = e.what();
    const auto colon = what.find(": ");
    if (colon != std::string::npos && what.size() > 8 &&
        what.compare(what.size() - 8, 8, " missing") == 0) {
      throw usage_error(what.substr(0, colon) + ": needs a value");
    }
    if (const auto at = what.find(" was given a disallowed flag override");
        at != std::string::npos) {
      throw usage_error("--" + what.substr(0, at) + ": takes no value");
    }
    throw usage_error(what);
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
}

/// Whether `flag` was given on the command line.
inline bool given(const CLI::App& app, const std::string& flag) { return app.count(flag) != 0; }

/// The planning flags prepack_plan and prepack_demo share: --capacity and --max-pad.
struct plan_flags {
  std::optional<double> max_pad;  // --max-pad: a fitted plan at this pad budget
  std::string max_pad_text;       // as given, for the report
};

/// The plan the planning flags ask for: with --max-pad F, fitted_plan at that budget
/// (`capacity`, from --capacity, the widest row allowed); else `kind` at `capacity`.
template <class Length>
prepack::pack_plan<Length> plan_from_flags(const plan_flags& f, prepack::packer kind,
                                           const std::vector<Length>& length,
                                           std::optional<Length> capacity) {
  if (!f.max_pad) return prepack::make_plan(kind, length, capacity);
  prepack::fit_options fit;
  fit.max_pad = *f.max_pad;
  if (capacity) fit.max_capacity = static_cast<unsigned long long>(*capacity);
  return prepack::fitted_plan(kind, length, fit);
}

/// Adds --max-pad to `app`, bound to `f`.
inline CLI::Option* add_max_pad(CLI::App& app, plan_flags& f, const std::string& description) {
  return app
      .add_option_function<std::string>(
          "--max-pad",
          [&f](const std::string& s) {
            f.max_pad_text = s;
            f.max_pad = std::strtod(s.c_str(), nullptr);
          },
          description)
      ->check(real(0.0, 1e9))
      ->type_name("F");
}

}  // namespace support
