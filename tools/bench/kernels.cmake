# kernel_bench: throughput of the CPU reduce kernels next to memcpy.
add_executable(kernel_bench ${CMAKE_CURRENT_LIST_DIR}/kernel_bench.cc)
target_link_libraries(kernel_bench PRIVATE hsdp_cpu_kernels)
include(${CMAKE_CURRENT_LIST_DIR}/cluster_engine_bench.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/membership_sim.cmake)
