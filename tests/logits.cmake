# Runs the demo with --logits FILE and checks the file holds n_prompts x vocab float32:
# cmake -DDEMO=... -DFILE=... -DBYTES=... -DARGS=... -P logits.cmake
file(REMOVE ${FILE})
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${DEMO} ${args} --logits ${FILE} RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "prepack_demo exited with ${rc}")
endif()
file(SIZE ${FILE} size)
if(NOT size EQUAL BYTES)
  message(FATAL_ERROR "${FILE}: ${size} bytes, expected ${BYTES}")
endif()
message("${FILE}: ${size} bytes, as expected")
