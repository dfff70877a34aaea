// prepack/engines.hpp - every engine's own form of a step (standard library only): vLLM v1,
// FlashInfer, SGLang, TensorRT-LLM and llama.cpp, each by that engine's names, types and
// conventions, built from prepack's step_inputs (or, for llama.cpp, from a schedule).
#pragma once

#include "engines/flashinfer.hpp"
#include "engines/llama_cpp.hpp"
#include "engines/sglang.hpp"
#include "engines/trtllm.hpp"
#include "engines/vllm.hpp"
