# The demo's JSON names a --prompts file whose path holds a double quote and a backslash, and the
# output still parses, with the path read back exactly:
#   cmake -DDEMO=... -DDATA=<prompts file> -DWORK=<dir> "-DARGS=..." -P json_path.cmake
file(MAKE_DIRECTORY "${WORK}")
set(weird "${WORK}/we\"ird\\name.txt")
file(COPY_FILE "${DATA}" "${weird}")
set(args ${ARGS})  # a CMake list
execute_process(COMMAND ${DEMO} --prompts "${weird}" ${args} --json RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "prepack_demo exited with ${rc}: ${err}")
endif()
string(JSON workload ERROR_VARIABLE parse_error GET "${out}" workload)
if(parse_error)
  message("${out}")
  message(FATAL_ERROR "the output is not JSON: ${parse_error}")
endif()
if(NOT workload STREQUAL weird)
  message(FATAL_ERROR "workload '${workload}', expected '${weird}'")
endif()
message("the path '${weird}' round-trips through the demo's JSON")
