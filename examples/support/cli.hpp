// support/cli.hpp - a small command-line parser for prepack's example binaries: --flag VALUE and
// --switch forms, integers range-checked, every mistake reported as one line naming the flag and
// value.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "prepack/error.hpp"
#include "prepack/plan.hpp"

namespace support {

/// A usage mistake: the binary prints what() and exits with code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class args {
 public:
  /// `valued` flags take a value, `switches` do not; anything else is an error.
  args(int argc, char** argv, std::set<std::string> valued, std::set<std::string> switches) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      std::string value;
      bool has_value = false;
      if (a.rfind("--", 0) != 0) throw usage_error("unexpected argument '" + a + "' (try --help)");
      if (const auto eq = a.find('='); eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_value = true;
      }
      if (switches.count(a)) {
        if (has_value) throw usage_error(a + " takes no value");
        values_[a] = "1";
      } else if (valued.count(a)) {
        if (!has_value) {
          if (i + 1 >= argc) throw usage_error(a + " needs a value");
          value = argv[++i];
          // "--capacity --batch 3": the value forgotten, not a value that looks like a flag.
          if (value.rfind("--", 0) == 0) {
            throw usage_error(a + " needs a value (before '" + value + "')");
          }
        }
        values_[a] = value;
      } else {
        throw usage_error("unknown flag '" + a + "' (try --help)");
      }
    }
  }

  bool has(const std::string& flag) const { return values_.count(flag) != 0; }

  std::string str(const std::string& flag, const std::string& fallback) const {
    const auto it = values_.find(flag);
    return it == values_.end() ? fallback : it->second;
  }

  long long integer(const std::string& flag, long long fallback, long long lo, long long hi) const {
    const auto it = values_.find(flag);
    if (it == values_.end()) return fallback;
    const std::string& s = it->second;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE) {
      throw usage_error(flag + " '" + s + "' is not an integer");
    }
    if (v < lo || v > hi) {
      throw usage_error(flag + " " + s + " outside " + std::to_string(lo) + ".." +
                        std::to_string(hi));
    }
    return v;
  }

  double real(const std::string& flag, double fallback, double lo, double hi) const {
    const auto it = values_.find(flag);
    if (it == values_.end()) return fallback;
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0' || !(v >= lo && v <= hi)) {
      throw usage_error(flag + " '" + it->second + "' is not a number in [" + std::to_string(lo) +
                        ", " + std::to_string(hi) + "]");
    }
    return v;
  }

  std::string choice(const std::string& flag, const std::string& fallback,
                     const std::vector<std::string>& options) const {
    const std::string v = str(flag, fallback);
    for (const auto& o : options) {
      if (o == v) return v;
    }
    std::string list;
    for (const auto& o : options) list += (list.empty() ? "" : "|") + o;
    throw usage_error(flag + " '" + v + "' is not one of " + list);
  }

 private:
  std::map<std::string, std::string> values_;
};

/// The plan the shared planning flags ask for: with --max-pad F, fitted_plan at that budget
/// (`capacity`, from --capacity, the widest row allowed); else `kind` at `capacity`.
template <class Length>
prepack::pack_plan<Length> plan_from_flags(const args& a, prepack::packer kind,
                                           const std::vector<Length>& length,
                                           std::optional<Length> capacity) {
  if (!a.has("--max-pad")) return prepack::make_plan(kind, length, capacity);
  prepack::fit_options fit;
  fit.max_pad = a.real("--max-pad", 0.05, 0.0, 1e9);
  if (capacity) fit.max_capacity = static_cast<unsigned long long>(*capacity);
  return prepack::fitted_plan(kind, length, fit);
}

/// The union of two flag sets (a binary's own flags and the shared model flags).
inline std::set<std::string> with(std::set<std::string> a, const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

/// Runs a binary's body and turns whatever escapes it into one line on stderr and an exit code,
/// never std::terminate: 2 for a caller's mistake (a bad flag: usage_error; bad input:
/// prepack::error; a workload too big for this machine's memory: std::bad_alloc), 1 for anything
/// else (a bug, reported as such).
template <class Body>
int guarded_main(const char* program, Body&& body) noexcept {
  try {
    return body();
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
  } catch (const prepack::error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "%s: out of memory for this workload (use fewer or shorter prompts or a "
                 "smaller model)\n",
                 program);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "%s: internal error (an unknown exception)\n", program);
    return 1;
  }
  return 2;
}

}  // namespace support
