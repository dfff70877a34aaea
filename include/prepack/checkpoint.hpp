// prepack/checkpoint.hpp - real checkpoints (needs POSIX and nlohmann-json; the loader fills the
// reference model's weights): GGUF and safetensors readers over memory-mapped files, ggml's
// quantized blocks, and the loader of GGUF files and Hugging Face directories. Link
// prepack::checkpoint.
#pragma once

#include "checkpoint/gguf.hpp"
#include "checkpoint/load.hpp"
#include "checkpoint/mapped_file.hpp"
#include "checkpoint/quant.hpp"
#include "checkpoint/safetensors.hpp"
