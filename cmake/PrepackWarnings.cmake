# Warnings for prepack's own targets only; never pushed onto consumers.
function(prepack_warnings target)
  if(MSVC)
    target_compile_options(${target} PRIVATE /W4 $<$<BOOL:${PREPACK_WERROR}>:/WX>)
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wconversion -Wshadow
                                             $<$<BOOL:${PREPACK_WERROR}>:-Werror>)
  endif()
endfunction()
