# Compiles every public header alone with one compiler and one set of flags, as a consumer's
# translation unit would: cmake -DCXX=... -DFLAGS=... -DHEADERS=... -DROOT=... -DWORK=...
# -P headers.cmake. Flags are strict (-Wall -Wextra -Wpedantic -Werror, with or without
# OpenMP); a header that needs Eigen gets Eigen's include directory, one that needs nlohmann-json
# gets its own.
file(MAKE_DIRECTORY ${WORK})
separate_arguments(flag_list UNIX_COMMAND "${FLAGS}")
set(failed "")
foreach(header IN LISTS HEADERS)
  string(MAKE_C_IDENTIFIER ${header} id)
  set(src ${WORK}/${id}.cpp)
  file(WRITE ${src} "#include <${header}>\nint main() { return 0; }\n")
  execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only ${flag_list} -I${ROOT}/include ${EXTRA}
                          ${src}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message("${header}: ${CXX} ${FLAGS} failed:\n${out}${err}")
    list(APPEND failed ${header})
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "headers that do not compile alone under ${CXX} ${FLAGS}: ${failed}")
endif()
list(LENGTH HEADERS n)
message("${n} headers compile alone under ${CXX} ${FLAGS}")
