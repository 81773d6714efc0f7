# hsdp-gpu-bench: the NCCL engine vs raw NCCL in the same process (CUDA builds only).
if(HSDP_CUDA_ENABLED)
  add_executable(hsdp-gpu-bench ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cc)
  target_link_libraries(hsdp-gpu-bench PRIVATE hsdp_nccl_cuda absl::strings)
endif()
