// prepack/reference.hpp - the reference model (needs Eigen): prefill over packed or padded
// layouts, per-prompt caches, greedy decoding. Link prepack::reference.
#pragma once

#include "prepack.hpp"
#include "reference/decode.hpp"
#include "reference/model.hpp"
