# hsdp_device: the device interface and its host-memory fake (always built).
# hsdp_device_cuda: the CUDA implementation and its kernels (HSDP_CUDA_ENABLED
# only). The NCCL binding is the engine layer's (engine/nccl/nccl.cmake).
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

if(HSDP_CUDA_ENABLED)
  # The kernels alone, with no C++20 dependencies (nvcc builds them as CUDA 17).
  add_library(hsdp_device_kernels STATIC ${CMAKE_CURRENT_LIST_DIR}/scale_cast.cu
    ${CMAKE_CURRENT_LIST_DIR}/intra_device_reduce.cu)
  target_include_directories(hsdp_device_kernels PRIVATE ${PROJECT_SOURCE_DIR}
    ${PROJECT_SOURCE_DIR}/client/include)
  set_target_properties(hsdp_device_kernels PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_compile_options(hsdp_device_kernels PRIVATE -Xcompiler=-Wall,-Wextra)
  add_library(hsdp_device_cuda STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_device_api.cc)
  target_include_directories(hsdp_device_cuda PUBLIC ${PROJECT_SOURCE_DIR})
  target_include_directories(hsdp_device_cuda SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(hsdp_device_cuda PUBLIC hsdp_device hsdp_device_kernels
    CUDA::cudart_static)
  target_compile_definitions(hsdp_device_cuda PUBLIC HSDP_HAVE_CUDA=1)
endif()
