add_library(hsdp_bench_util STATIC ${CMAKE_CURRENT_LIST_DIR}/bench_util.cc
  ${CMAKE_CURRENT_LIST_DIR}/bench_cluster.cc)
target_include_directories(hsdp_bench_util PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(hsdp_bench_util PUBLIC hsdp_common)

add_executable(hsdp-bench ${CMAKE_CURRENT_LIST_DIR}/hsdp_bench.cc)
target_link_libraries(hsdp-bench PRIVATE hsdp_client hsdp_bench_util)

# hsdp-handoff-bench: one shared-memory hand-off between processes, per spin mode.
add_executable(hsdp-handoff-bench ${CMAKE_CURRENT_LIST_DIR}/handoff_bench.cc)
target_link_libraries(hsdp-handoff-bench PRIVATE hsdp_shm)
