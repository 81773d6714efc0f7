# hsdp_cpu_kernels: vectorised reductions and casts on host memory (the CPU
# engine's arithmetic, and the device fake's).
add_library(hsdp_cpu_kernels STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cast.cc
  ${CMAKE_CURRENT_LIST_DIR}/float16_convert.cc
  ${CMAKE_CURRENT_LIST_DIR}/reduce_avx2.cc
  ${CMAKE_CURRENT_LIST_DIR}/reduce_int.cc
  ${CMAKE_CURRENT_LIST_DIR}/reduce_kernels.cc
  ${CMAKE_CURRENT_LIST_DIR}/reduce_scalar.cc)
target_include_directories(hsdp_cpu_kernels PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_cpu_kernels PUBLIC hsdp_common)
# -O3 for speed; not in the sanitizer builds, which measure no speed and
# where -O3 costs a minute of compile time per file.
if(NOT HSDP_SANITIZE)
  target_compile_options(hsdp_cpu_kernels PRIVATE -O3)
endif()
