# The Python prepack's module is built for, and its Python tests and oracles run with:
#   Python_EXECUTABLE when given (scikit-build-core gives the one pip runs);
#   else the environment .ci/fetch-oracles makes, $PREPACK_CACHE/venv (default
#   $XDG_CACHE_HOME/prepack or ~/.cache/prepack), when it exists;
#   else the first python3 CMake finds.
# Sets PREPACK_PYTHON_FOUND, Python_EXECUTABLE and, when PREPACK_PYTHON is on and that Python
# has nanobind, PREPACK_HAVE_NANOBIND (nanobind's CMake package found) or PREPACK_NANOBIND_WHY.
# The tests alone (the oracles) need only the interpreter: nanobind is not asked for then.
macro(prepack_find_python)
  if(NOT DEFINED Python_EXECUTABLE AND NOT DEFINED ENV{VIRTUAL_ENV})
    if(DEFINED ENV{PREPACK_CACHE} AND NOT "$ENV{PREPACK_CACHE}" STREQUAL "")
      set(prepack_cache "$ENV{PREPACK_CACHE}")
    elseif(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
      set(prepack_cache "$ENV{XDG_CACHE_HOME}/prepack")
    else()
      set(prepack_cache "$ENV{HOME}/.cache/prepack")
    endif()
    if(EXISTS "${prepack_cache}/venv/bin/python")
      set(Python_EXECUTABLE "${prepack_cache}/venv/bin/python")
      message(STATUS "prepack: Python from the oracle environment ${prepack_cache}/venv")
    endif()
  endif()
  find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
  set(PREPACK_PYTHON_FOUND ${Python_Interpreter_FOUND})
  set(PREPACK_HAVE_NANOBIND OFF)
  if(NOT Python_Interpreter_FOUND)
    set(PREPACK_NANOBIND_WHY "no Python interpreter found")
  elseif(NOT PREPACK_PYTHON)
    set(PREPACK_NANOBIND_WHY "PREPACK_PYTHON is OFF")
  elseif(NOT Python_Development.Module_FOUND)
    set(PREPACK_NANOBIND_WHY "no Python headers for ${Python_EXECUTABLE} (apt-get install python3-dev)")
  else()
    execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                    OUTPUT_VARIABLE prepack_nanobind_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE prepack_nanobind_rc ERROR_QUIET)
    if(prepack_nanobind_rc EQUAL 0)
      find_package(nanobind CONFIG QUIET HINTS "${prepack_nanobind_dir}")
    endif()
    if(nanobind_FOUND)
      set(PREPACK_HAVE_NANOBIND ON)
    else()
      set(PREPACK_NANOBIND_WHY "nanobind is not installed for ${Python_EXECUTABLE} (pip install nanobind, or run .ci/fetch-oracles)")
    endif()
  endif()
endmacro()
