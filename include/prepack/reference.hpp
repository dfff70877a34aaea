// prepack/reference.hpp - the reference model (needs Eigen; oneDNN when the build found it):
// prefill over packed or padded layouts, steps over a paged KV pool, per-prompt caches, greedy
// decoding, and the prefill-alone oracles. Link prepack::reference.
#pragma once

#include "prepack.hpp"
#include "reference/alone.hpp"
#include "reference/attention.hpp"
#include "reference/batch.hpp"
#include "reference/bf16_speed.hpp"
#include "reference/decode.hpp"
#include "reference/gemm.hpp"
#include "reference/kv_pool.hpp"
#include "reference/linear.hpp"
#include "reference/matrix.hpp"
#include "reference/model.hpp"
#include "reference/run.hpp"
#include "reference/serve.hpp"
#include "reference/weights.hpp"
#include "reference/workspace.hpp"
