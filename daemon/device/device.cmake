# hsdp_device: the device interface and its host-memory fake (always built).
# hsdp_device_cuda: the CUDA implementation and the NCCL binding (HSDP_CUDA_ENABLED only).
add_library(hsdp_device STATIC
  ${CMAKE_CURRENT_LIST_DIR}/device_api.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_device_api.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_device_kernels.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_device_memory.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_shm.cc)
target_include_directories(hsdp_device PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_device PUBLIC hsdp_common hsdp_cpu_kernels absl::status absl::statusor
  absl::strings Threads::Threads)

# hsdp_device_buffers: the per-session device-buffer registry and mapping cache.
add_library(hsdp_device_buffers STATIC ${CMAKE_CURRENT_LIST_DIR}/../session/device_buffers.cc)
target_link_libraries(hsdp_device_buffers PUBLIC hsdp_device hsdp_shm)

# The real CUDA device API, its kernel and the NCCL binding.
if(HSDP_CUDA_ENABLED)
  # The kernel alone, with no C++20 dependencies (nvcc builds it as CUDA 17).
  add_library(hsdp_device_kernels STATIC ${CMAKE_CURRENT_LIST_DIR}/scale_cast.cu
    ${CMAKE_CURRENT_LIST_DIR}/../engine/nccl/intra_device_reduce.cu)
  target_include_directories(hsdp_device_kernels PRIVATE ${PROJECT_SOURCE_DIR}
    ${PROJECT_SOURCE_DIR}/client/include)
  set_target_properties(hsdp_device_kernels PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_compile_options(hsdp_device_kernels PRIVATE -Xcompiler=-Wall,-Wextra)
  add_library(hsdp_device_cuda STATIC
    ${CMAKE_CURRENT_LIST_DIR}/cuda_device_api.cc
    ${CMAKE_CURRENT_LIST_DIR}/../engine/nccl/nccl_collectives.cc)
  target_include_directories(hsdp_device_cuda PUBLIC ${PROJECT_SOURCE_DIR})
  target_include_directories(hsdp_device_cuda SYSTEM PRIVATE ${NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(hsdp_device_cuda PUBLIC hsdp_device hsdp_nccl_engine hsdp_device_kernels
    CUDA::cudart_static ${NCCL_LIBRARY})
  target_compile_definitions(hsdp_device_cuda PUBLIC HSDP_HAVE_CUDA=1)
endif()

# hsdp_device_service: registration (session checks, VMM fds) and the gRPC service.
add_library(hsdp_device_service STATIC
  ${CMAKE_CURRENT_LIST_DIR}/device_registration.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_service.cc)
target_link_libraries(hsdp_device_service PUBLIC hsdp_device_buffers hsdp_daemon_lib hsdp_proto)
