// libFuzzer target: the prompt-file reader behind prepack_demo --prompts. Any bytes either give
// records of in-range values on the lines they came from, or a prepack::error naming the source.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "support/workload.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  const long long limit = 1000;
  try {
    const auto recs = support::read_records(in, "fuzz.txt", "token id", limit, 4096);
    std::size_t last_line = 0;
    for (const auto& r : recs) {
      if (r.values.empty() || r.line <= last_line) __builtin_trap();
      last_line = r.line;
      for (long long v : r.values) {
        if (v < 0 || v >= limit) __builtin_trap();
      }
    }
  } catch (const prepack::error& e) {
    if (std::string(e.what()).rfind("fuzz.txt", 0) != 0) __builtin_trap();
  }
  return 0;
}
