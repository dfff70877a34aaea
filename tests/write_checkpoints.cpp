// Writes the small checkpoints the example tests load: DIR/tiny-llama-q8.gguf (architecture
// llama, Q/K permuted as llama.cpp's converter does, Q8_0 matrices), DIR/tiny-qwen2.gguf
// (biases, tied embeddings, F16) and DIR/tiny-hf (a Hugging Face directory, two BF16 shards).
#include <cstdio>
#include <filesystem>
#include <string>

#include "checkpoint_writer.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_checkpoints DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir + "/tiny-hf");
  test::ref::config c;
  c.vocab = 256;
  c.hidden = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn = 128;
  const auto w = test::ref::random_weights(c, 3);
  test::write_file(dir + "/tiny-llama-q8.gguf",
                   test::gguf_bytes(c, w, {"llama", test::dtype::q8_0, "tiny-llama", true}));
  test::ref::config q = c;
  q.qkv_bias = true;
  q.tied_embeddings = true;
  test::write_file(dir + "/tiny-qwen2.gguf",
                   test::gguf_bytes(q, test::ref::random_weights(q, 4),
                                    {"qwen2", test::dtype::f16, "tiny-qwen2", false}));
  test::write_hf_dir(dir + "/tiny-hf", c, w, test::dtype::bf16, 2);
  return 0;
}
