// prepack/prepack.hpp - the whole standard-library-only API: planner, layouts, masks and
// engine formats, unpacker. The reference model (Eigen) is separate:
// prepack/reference/model.hpp.
#pragma once

#include "config.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "mask.hpp"
#include "plan.hpp"
#include "span.hpp"
#include "unpack.hpp"
#include "workload.hpp"
