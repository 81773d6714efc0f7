# hsdp-gpu-bench: the NCCL engine vs raw NCCL in the same process (CUDA builds only).
if(HSDP_CUDA_ENABLED)
  add_executable(hsdp-gpu-bench ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cc)
  target_link_libraries(hsdp-gpu-bench PRIVATE hsdp_nccl_cuda absl::strings)
endif()

# hsdp-overlap-probe: what another uid's process can run beside a trainer's kernel without
# MPS (issue 36; run_gpu_tests.sh --stage overlap). Runtime API only: the driver's stream
# memory operations come through cudaGetDriverEntryPointByVersion, so the binary starts (and
# says "no GPU") on a machine without a driver.
if(HSDP_CUDA_ENABLED)
  add_executable(hsdp-overlap-probe ${CMAKE_CURRENT_LIST_DIR}/gpu_overlap_probe_main.cc
    ${CMAKE_CURRENT_LIST_DIR}/gpu_overlap_probe.cu)
  target_include_directories(hsdp-overlap-probe PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(hsdp-overlap-probe PRIVATE CUDA::cudart_static)
  target_include_directories(hsdp-overlap-probe SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  set_target_properties(hsdp-overlap-probe PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
endif()
