# find_package first; on a machine that is online, FetchContent as a fallback. Used by prepack's
# own tests, benchmarks and examples, and for Eigen by prepack::reference.
include(FetchContent)

macro(prepack_find_eigen)
  if(NOT TARGET Eigen3::Eigen)
    find_package(Eigen3 3.3 QUIET NO_MODULE)
  endif()
  if(NOT TARGET Eigen3::Eigen)
    message(STATUS "prepack: Eigen3 not found, fetching it")
    set(EIGEN_BUILD_DOC OFF CACHE BOOL "" FORCE)
    set(BUILD_TESTING OFF CACHE BOOL "" FORCE)
    FetchContent_Declare(eigen GIT_REPOSITORY https://gitlab.com/libeigen/eigen.git GIT_TAG 3.4.0
                         GIT_SHALLOW TRUE)
    FetchContent_MakeAvailable(eigen)
  endif()
endmacro()

macro(prepack_find_gtest)
  if(NOT TARGET GTest::gtest_main)
    find_package(GTest QUIET)
  endif()
  if(NOT TARGET GTest::gtest_main)
    message(STATUS "prepack: GoogleTest not found, fetching it")
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    FetchContent_Declare(googletest GIT_REPOSITORY https://github.com/google/googletest.git
                         GIT_TAG release-1.12.1 GIT_SHALLOW TRUE)
    FetchContent_MakeAvailable(googletest)
  endif()
endmacro()

macro(prepack_find_benchmark)
  if(NOT TARGET benchmark::benchmark)
    find_package(benchmark QUIET)
  endif()
  if(NOT TARGET benchmark::benchmark)
    message(STATUS "prepack: Google Benchmark not found, fetching it")
    set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
    set(BENCHMARK_ENABLE_INSTALL OFF CACHE BOOL "" FORCE)
    FetchContent_Declare(benchmark GIT_REPOSITORY https://github.com/google/benchmark.git
                         GIT_TAG v1.7.1 GIT_SHALLOW TRUE)
    FetchContent_MakeAvailable(benchmark)
  endif()
endmacro()
