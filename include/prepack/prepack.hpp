// prepack/prepack.hpp - the whole standard-library-only API: planner, layouts, masks, engine
// formats, unpacker, budgeted schedules and their step inputs over a paged pool, shared prefixes.
// Synthetic workloads and the prompt-file reader (prepack/workload.hpp) are for demos and
// benchmarks and are not included here; the reference model (Eigen) is separate:
// prepack/reference.hpp.
#pragma once

#include "config.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "mask.hpp"
#include "numeric.hpp"
#include "paged.hpp"
#include "plan.hpp"
#include "prefix.hpp"
#include "schedule.hpp"
#include "span.hpp"
#include "step.hpp"
#include "unpack.hpp"
