# hsdp_device: the device interface and its host-memory fake (always built).
# hsdp_device_cuda: the CUDA implementation and the NCCL binding (HSDP_CUDA_ENABLED only).
add_library(hsdp_device STATIC
  ${CMAKE_CURRENT_LIST_DIR}/device_api.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_device_api.cc)
target_include_directories(hsdp_device PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_device PUBLIC hsdp_common hsdp_cpu_kernels absl::status absl::statusor
  absl::strings Threads::Threads)

# hsdp_device_buffers: the per-session device-buffer registry and mapping cache.
add_library(hsdp_device_buffers STATIC ${CMAKE_CURRENT_LIST_DIR}/../session/device_buffers.cc)
target_link_libraries(hsdp_device_buffers PUBLIC hsdp_device hsdp_shm)
