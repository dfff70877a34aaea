// A test tool: prepack's dequantization of a GGUF file's tensors, for the oracle scripts in
// tests/oracle/ to compare with llama.cpp's own Python package.
//   gguf_tensors FILE          one line per tensor: name, ggml type, element count
//   gguf_tensors FILE NAME     tensor NAME dequantized to fp32, raw little-endian, on stdout
#include <cstdio>
#include <string>
#include <vector>

#include "prepack/checkpoint/gguf.hpp"
#include "prepack/checkpoint/mapped_file.hpp"
#include "support/main.hpp"

int main(int argc, char** argv) {
  return support::guarded_main("gguf_tensors", [&] {
    if (argc != 2 && argc != 3) throw support::usage_error("usage: gguf_tensors FILE [TENSOR]");
    const prepack::checkpoint::mapped_file f(argv[1]);
    const prepack::checkpoint::gguf_file g(f.bytes(), argv[1]);
    if (argc == 2) {
      for (const auto& t : g.tensors()) {
        std::printf("%s %s %llu\n", t.name.c_str(), prepack::checkpoint::ggml_type_name(t.type),
                    static_cast<unsigned long long>(t.elements()));
      }
      return 0;
    }
    const auto* t = g.find(argv[2]);
    if (t == nullptr) throw support::usage_error(std::string("no tensor '") + argv[2] + "'");
    std::vector<float> out(t->elements());
    g.read(*t, prepack::span<float>(out));
    if (std::fwrite(out.data(), sizeof(float), out.size(), stdout) != out.size()) return 1;
    return 0;
  });
}
