# The consumer program, linked the way every consumer project links prepack.
add_executable(consumer ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp)
target_link_libraries(consumer PRIVATE prepack::prepack)
if(TARGET prepack::reference)
  target_link_libraries(consumer PRIVATE prepack::reference)
  target_compile_definitions(consumer PRIVATE PREPACK_CONSUMER_REFERENCE)
endif()
