// prepack/config.hpp - version, namespace and assertion macros shared by every header.
//
// The version is written here and nowhere else: CMake reads it from this file, and the inline
// namespace is derived from it.
#pragma once

#define PREPACK_VERSION_MAJOR 0
#define PREPACK_VERSION_MINOR 3
#define PREPACK_VERSION_PATCH 0

#define PREPACK_DETAIL_NS_CAT(major, minor) v##major##_##minor
#define PREPACK_DETAIL_NS(major, minor) PREPACK_DETAIL_NS_CAT(major, minor)
/// The inline namespace of this version (v0_3): two copies of this header-only library of
/// different versions in one program cannot clash at link time.
#define PREPACK_INLINE_NAMESPACE PREPACK_DETAIL_NS(PREPACK_VERSION_MAJOR, PREPACK_VERSION_MINOR)

#define PREPACK_NAMESPACE_BEGIN \
  namespace prepack {           \
  inline namespace PREPACK_INLINE_NAMESPACE {
#define PREPACK_NAMESPACE_END \
  }                           \
  }

// PREPACK_ASSERT guards internal invariants only (never caller mistakes, which throw
// prepack::error). Define it before including any prepack header to route it elsewhere.
#ifndef PREPACK_ASSERT
#include <cassert>
#define PREPACK_ASSERT(cond) assert(cond)
#endif

// PREPACK_OMP(directive) is `#pragma omp directive` when the translation unit is built with
// OpenMP and nothing otherwise, so the headers compile cleanly under -Wunknown-pragmas -Werror
// without it.
#ifdef _OPENMP
#define PREPACK_DETAIL_PRAGMA(x) _Pragma(#x)
#define PREPACK_OMP(directive) PREPACK_DETAIL_PRAGMA(omp directive)
#else
#define PREPACK_OMP(directive)
#endif
