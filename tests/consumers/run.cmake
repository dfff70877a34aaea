# Builds and runs one consumer project: cmake -DMODE=... -DPREPACK_SOURCE=... -DPREPACK_BUILD=...
# -DWORK=... -P run.cmake. MODE is add_subdirectory, find_package or fetch_content.
set(src ${CMAKE_CURRENT_LIST_DIR}/${MODE})
file(REMOVE_RECURSE ${WORK})
set(extra "")
if(MODE STREQUAL "find_package")
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${PREPACK_BUILD} --prefix ${WORK}/prefix
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(rc)
    message(FATAL_ERROR "install of prepack failed")
  endif()
  set(extra -DCMAKE_PREFIX_PATH=${WORK}/prefix)
  if(NOT EXISTS ${WORK}/prefix/share/cmake/prepack/prepack-config-version.cmake)
    message(FATAL_ERROR "the install has no prepack-config-version.cmake")
  endif()
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${src} -B ${WORK}/build -DPREPACK_SOURCE=${PREPACK_SOURCE}
                        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release ${extra}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the ${MODE} consumer failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the ${MODE} consumer failed")
endif()
execute_process(COMMAND ${WORK}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the ${MODE} consumer failed")
endif()
# A consumer must not see prepack's tests, benchmarks or examples.
if(EXISTS ${WORK}/build/prepack/tests OR EXISTS ${WORK}/build/_deps/prepack-build/tests)
  message(FATAL_ERROR "prepack built its tests inside a consumer")
endif()
