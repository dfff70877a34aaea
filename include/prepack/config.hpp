// prepack/config.hpp - version, namespace and assertion macros shared by every header.
#pragma once

#define PREPACK_VERSION_MAJOR 0
#define PREPACK_VERSION_MINOR 1
#define PREPACK_VERSION_PATCH 0

// Every symbol lives in an inline namespace named after the version, so two copies of this
// header-only library of different versions in one program cannot clash at link time.
#define PREPACK_NAMESPACE_BEGIN \
  namespace prepack {           \
  inline namespace v0_1 {
#define PREPACK_NAMESPACE_END \
  }                           \
  }

// PREPACK_ASSERT guards internal invariants only (never caller mistakes, which throw
// prepack::error). Define it before including any prepack header to route it elsewhere.
#ifndef PREPACK_ASSERT
#include <cassert>
#define PREPACK_ASSERT(cond) assert(cond)
#endif
