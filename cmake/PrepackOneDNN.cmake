# prepack::dnnl - oneDNN for the reference model's GEMMs, when it is installed and can share the
# process's OpenMP runtime (oneDNN's Debian build runs on GNU OpenMP; clang's LLVM OpenMP
# cannot be mixed with it, so clang builds use the Eigen GEMMs). Used by prepack's own build and
# by its installed package config, so both find the same library the same way.
# Sets PREPACK_HAVE_ONEDNN and, when true, defines the imported target prepack::dnnl.
function(prepack_find_onednn)
  set(PREPACK_HAVE_ONEDNN OFF PARENT_SCOPE)
  set(PREPACK_ONEDNN_WHY "" PARENT_SCOPE)
  if(TARGET prepack::dnnl)
    set(PREPACK_HAVE_ONEDNN ON PARENT_SCOPE)
    return()
  endif()
  find_package(OpenMP COMPONENTS CXX QUIET)
  if(NOT OpenMP_CXX_FOUND)
    set(PREPACK_ONEDNN_WHY "no OpenMP" PARENT_SCOPE)
    return()
  endif()
  if(NOT "gomp" IN_LIST OpenMP_CXX_LIB_NAMES)
    set(PREPACK_ONEDNN_WHY "this compiler's OpenMP runtime (${OpenMP_CXX_LIB_NAMES}) is not oneDNN's (gomp)"
        PARENT_SCOPE)
    return()
  endif()
  find_path(PREPACK_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
  find_library(PREPACK_DNNL_LIBRARY dnnl)
  if(NOT PREPACK_DNNL_INCLUDE_DIR OR NOT PREPACK_DNNL_LIBRARY)
    set(PREPACK_ONEDNN_WHY "oneDNN not found (apt-get install libdnnl-dev)" PARENT_SCOPE)
    return()
  endif()
  add_library(prepack::dnnl INTERFACE IMPORTED GLOBAL)
  set_target_properties(prepack::dnnl PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${PREPACK_DNNL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${PREPACK_DNNL_LIBRARY};OpenMP::OpenMP_CXX"
    INTERFACE_COMPILE_DEFINITIONS PREPACK_HAVE_ONEDNN)
  set(PREPACK_HAVE_ONEDNN ON PARENT_SCOPE)
endfunction()
