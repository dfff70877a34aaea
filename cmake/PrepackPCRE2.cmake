# prepack::pcre2 - PCRE2 (8-bit code units), the Unicode regular expressions of prepack::text's
# pre-tokenizers. Used by prepack's own build and by its installed package config.
# Sets PREPACK_HAVE_PCRE2 and, when true, defines the imported target prepack::pcre2.
function(prepack_find_pcre2)
  set(PREPACK_HAVE_PCRE2 OFF PARENT_SCOPE)
  if(TARGET prepack::pcre2)
    set(PREPACK_HAVE_PCRE2 ON PARENT_SCOPE)
    return()
  endif()
  find_path(PREPACK_PCRE2_INCLUDE_DIR pcre2.h)
  find_library(PREPACK_PCRE2_LIBRARY pcre2-8)
  if(NOT PREPACK_PCRE2_INCLUDE_DIR OR NOT PREPACK_PCRE2_LIBRARY)
    return()
  endif()
  add_library(prepack::pcre2 INTERFACE IMPORTED GLOBAL)
  set_target_properties(prepack::pcre2 PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${PREPACK_PCRE2_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${PREPACK_PCRE2_LIBRARY}"
    INTERFACE_COMPILE_DEFINITIONS PCRE2_CODE_UNIT_WIDTH=8)
  set(PREPACK_HAVE_PCRE2 ON PARENT_SCOPE)
endfunction()
