add_executable(hsdpctl ${CMAKE_CURRENT_LIST_DIR}/hsdpctl/main.cc)
target_link_libraries(hsdpctl PRIVATE hsdp_common hsdp_proto absl::time)

if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/bench/kernels.cmake)
  include(${CMAKE_CURRENT_LIST_DIR}/bench/kernels.cmake)
endif()
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/bench/hsdp_bench.cmake)
  include(${CMAKE_CURRENT_LIST_DIR}/bench/hsdp_bench.cmake)
endif()
