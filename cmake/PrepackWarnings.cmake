# Warnings (and, with PREPACK_NATIVE, -march=native) for prepack's own targets only; never pushed
# onto consumers through the INTERFACE targets.
include(CheckCXXCompilerFlag)
if(PREPACK_NATIVE AND NOT MSVC)
  check_cxx_compiler_flag(-march=native PREPACK_HAS_MARCH_NATIVE)
endif()

function(prepack_own_target target)
  if(PREPACK_NATIVE AND PREPACK_HAS_MARCH_NATIVE)
    target_compile_options(${target} PRIVATE -march=native)
    # GCC 12's AVX-512 intrinsics headers trip -Wmaybe-uninitialized when Eigen inlines them
    # (GCC bug 105593, a false positive inside the compiler's own header): silenced only for
    # targets that use Eigen through prepack::reference, known once their links are.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12)
      target_compile_options(${target} PRIVATE
        $<$<OR:$<IN_LIST:prepack::reference,$<TARGET_PROPERTY:LINK_LIBRARIES>>,$<IN_LIST:prepack::checkpoint,$<TARGET_PROPERTY:LINK_LIBRARIES>>>:-Wno-maybe-uninitialized>)
    endif()
  endif()
  if(MSVC)
    target_compile_options(${target} PRIVATE /W4 $<$<BOOL:${PREPACK_WERROR}>:/WX>)
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wconversion -Wshadow
                                             $<$<BOOL:${PREPACK_WERROR}>:-Werror>)
  endif()
endfunction()
