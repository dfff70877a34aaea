# prepack's dependencies, found with find_package. A missing one stops the configuration with one
# line saying which Debian package to install (.ci/install-deps installs them all); with
# -DPREPACK_FETCH_DEPS=ON a missing one is fetched from the internet instead. Nothing here sets a
# cache entry or a variable of the project that includes prepack.
include(FetchContent)

# prepack_missing(<what> <debian package> <alternative>): the one-line error.
function(prepack_missing what package alternative)
  message(FATAL_ERROR "prepack: ${what} not found: apt-get install ${package} "
                      "(or .ci/install-deps; ${alternative})")
endfunction()

# Eigen 3 for prepack::reference. A fetched Eigen is used as headers only (its own CMake project,
# with its tests and options, is never added).
function(prepack_require_eigen)
  if(NOT TARGET Eigen3::Eigen)
    find_package(Eigen3 3.3 QUIET NO_MODULE)
  endif()
  if(TARGET Eigen3::Eigen)
    return()
  endif()
  if(NOT PREPACK_FETCH_DEPS)
    prepack_missing("Eigen 3" libeigen3-dev
                    "-DPREPACK_FETCH_DEPS=ON downloads it, -DPREPACK_REFERENCE=OFF builds the core alone")
  endif()
  message(STATUS "prepack: Eigen 3 not found, fetching it (PREPACK_FETCH_DEPS)")
  FetchContent_Declare(prepack_eigen GIT_REPOSITORY https://gitlab.com/libeigen/eigen.git
                       GIT_TAG 3.4.0 GIT_SHALLOW TRUE)
  FetchContent_GetProperties(prepack_eigen)
  if(NOT prepack_eigen_POPULATED)
    FetchContent_Populate(prepack_eigen)
  endif()
  add_library(prepack_fetched_eigen INTERFACE)
  target_include_directories(prepack_fetched_eigen SYSTEM INTERFACE ${prepack_eigen_SOURCE_DIR})
  add_library(Eigen3::Eigen ALIAS prepack_fetched_eigen)
endfunction()

# GoogleTest for prepack's own tests.
function(prepack_require_gtest)
  if(NOT TARGET GTest::gtest_main)
    find_package(GTest QUIET)
  endif()
  if(TARGET GTest::gtest_main)
    return()
  endif()
  if(NOT PREPACK_FETCH_DEPS)
    prepack_missing(GoogleTest libgtest-dev
                    "-DPREPACK_FETCH_DEPS=ON downloads it, -DPREPACK_BUILD_TESTS=OFF skips the tests")
  endif()
  message(STATUS "prepack: GoogleTest not found, fetching it (PREPACK_FETCH_DEPS)")
  set(INSTALL_GTEST OFF)
  FetchContent_Declare(googletest GIT_REPOSITORY https://github.com/google/googletest.git
                       GIT_TAG release-1.12.1 GIT_SHALLOW TRUE)
  FetchContent_MakeAvailable(googletest)
endfunction()

# Google Benchmark for prepack's own benchmarks.
function(prepack_require_benchmark)
  if(NOT TARGET benchmark::benchmark)
    find_package(benchmark QUIET)
  endif()
  if(TARGET benchmark::benchmark)
    return()
  endif()
  if(NOT PREPACK_FETCH_DEPS)
    prepack_missing("Google Benchmark" libbenchmark-dev
                    "-DPREPACK_FETCH_DEPS=ON downloads it, -DPREPACK_BUILD_BENCH=OFF skips the benchmarks")
  endif()
  message(STATUS "prepack: Google Benchmark not found, fetching it (PREPACK_FETCH_DEPS)")
  set(BENCHMARK_ENABLE_TESTING OFF)
  set(BENCHMARK_ENABLE_INSTALL OFF)
  FetchContent_Declare(benchmark GIT_REPOSITORY https://github.com/google/benchmark.git
                       GIT_TAG v1.7.1 GIT_SHALLOW TRUE)
  FetchContent_MakeAvailable(benchmark)
endfunction()

# nlohmann-json for the examples' JSON output (and prepack::checkpoint, which finds it itself).
function(prepack_require_json)
  if(NOT TARGET nlohmann_json::nlohmann_json)
    find_package(nlohmann_json 3 QUIET)
  endif()
  if(TARGET nlohmann_json::nlohmann_json)
    return()
  endif()
  if(NOT PREPACK_FETCH_DEPS)
    prepack_missing(nlohmann-json nlohmann-json3-dev
                    "-DPREPACK_FETCH_DEPS=ON downloads it, -DPREPACK_BUILD_EXAMPLES=OFF skips the examples")
  endif()
  message(STATUS "prepack: nlohmann-json not found, fetching it (PREPACK_FETCH_DEPS)")
  set(JSON_BuildTests OFF)
  set(JSON_Install OFF)
  FetchContent_Declare(nlohmann_json GIT_REPOSITORY https://github.com/nlohmann/json.git
                       GIT_TAG v3.11.2 GIT_SHALLOW TRUE)
  FetchContent_MakeAvailable(nlohmann_json)
endfunction()

# CLI11 (header-only) for the example binaries' command lines.
function(prepack_require_cli11)
  if(NOT TARGET CLI11::CLI11)
    find_package(CLI11 2 CONFIG QUIET)
  endif()
  if(TARGET CLI11::CLI11)
    return()
  endif()
  if(NOT PREPACK_FETCH_DEPS)
    prepack_missing(CLI11 libcli11-dev
                    "-DPREPACK_FETCH_DEPS=ON downloads it, -DPREPACK_BUILD_EXAMPLES=OFF skips the examples")
  endif()
  message(STATUS "prepack: CLI11 not found, fetching it (PREPACK_FETCH_DEPS)")
  FetchContent_Declare(prepack_cli11 GIT_REPOSITORY https://github.com/CLIUtils/CLI11.git
                       GIT_TAG v2.3.2 GIT_SHALLOW TRUE)
  FetchContent_GetProperties(prepack_cli11)
  if(NOT prepack_cli11_POPULATED)
    FetchContent_Populate(prepack_cli11)
  endif()
  add_library(prepack_fetched_cli11 INTERFACE)
  target_include_directories(prepack_fetched_cli11 SYSTEM INTERFACE ${prepack_cli11_SOURCE_DIR}/include)
  add_library(CLI11::CLI11 ALIAS prepack_fetched_cli11)
endfunction()
