// prepack/prepack.hpp - the whole standard-library-only API: planner, layouts, masks, engine
// formats, unpacker, budgeted schedules and their step inputs over a paged pool, shared
// prefixes, and every engine's own form of a step (prepack/engines/). The optional components
// are separate: prepack/reference.hpp (Eigen), prepack/checkpoint.hpp (POSIX, nlohmann-json).
#pragma once

#include "config.hpp"
#include "engine.hpp"
#include "engines.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "mask.hpp"
#include "numeric.hpp"
#include "paged.hpp"
#include "plan.hpp"
#include "prefix.hpp"
#include "schedule.hpp"
#include "serve.hpp"
#include "slots.hpp"
#include "span.hpp"
#include "step.hpp"
#include "unpack.hpp"
