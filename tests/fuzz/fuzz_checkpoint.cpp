// libFuzzer target: the GGUF and safetensors parsers behind prepack_demo --model. The first byte
// picks the format; any bytes either parse into tensors whose every byte lies inside the input
// (each is converted to fp32 here, so ASan sees every read), or give a prepack::error naming
// the file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "prepack/checkpoint/gguf.hpp"
#include "prepack/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool gguf = data[0] == 'G';
  const prepack::span<const unsigned char> bytes(data + 1, size - 1);
  try {
    std::vector<float> out;
    if (gguf) {
      const prepack::checkpoint::gguf_file f(bytes, "fuzz.gguf");
      for (const auto& t : f.tensors()) {
        if (t.offset + t.bytes > bytes.size()) __builtin_trap();
        out.resize(static_cast<std::size_t>(t.elements()));
        f.read(t, prepack::span<float>(out));
      }
    } else {
      const prepack::checkpoint::safetensors_file f(bytes, "fuzz.safetensors");
      for (const auto& t : f.tensors()) {
        if (t.offset + t.bytes > bytes.size()) __builtin_trap();
        out.resize(static_cast<std::size_t>(t.elements()));
        f.read(t, prepack::span<float>(out));
      }
    }
  } catch (const prepack::error& e) {
    const std::string what = e.what();
    if (what.rfind(gguf ? "fuzz.gguf" : "fuzz.safetensors", 0) != 0) __builtin_trap();
  }
  return 0;
}
