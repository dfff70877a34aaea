// support/main.hpp - how prepack's binaries end: a caller's mistake is one line on stderr and
// exit code 2, a bug is one line and exit code 1, and no exception ever reaches
// std::terminate. Standard C++ only (the benchmarks and test drivers use it too).
#pragma once

#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>

#include "prepack/error.hpp"

namespace support {

/// A usage mistake: the binary prints what() and exits with code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
