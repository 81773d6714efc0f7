add_executable(hsdpctl
  ${CMAKE_CURRENT_LIST_DIR}/hsdpctl/main.cc
  ${CMAKE_CURRENT_LIST_DIR}/hsdpctl/stragglers_command.cc
  ${CMAKE_CURRENT_LIST_DIR}/hsdpctl/top_command.cc
  ${CMAKE_CURRENT_LIST_DIR}/hsdpctl/trace_command.cc)
target_link_libraries(hsdpctl PRIVATE hsdp_common hsdp_proto absl::time)

if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/bench/kernels.cmake)
  include(${CMAKE_CURRENT_LIST_DIR}/bench/kernels.cmake)
endif()
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/bench/hsdp_bench.cmake)
  include(${CMAKE_CURRENT_LIST_DIR}/bench/hsdp_bench.cmake)
endif()
include(${CMAKE_CURRENT_LIST_DIR}/bench/baselines.cmake)
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/bench/gpu_bench.cmake)
  include(${CMAKE_CURRENT_LIST_DIR}/bench/gpu_bench.cmake)
endif()
# Installed: hsdpctl and hsdp-bench (the other tools and benchmarks stay in the build).
install(TARGETS hsdpctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
if(TARGET hsdp-bench)
  install(TARGETS hsdp-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
endif()
