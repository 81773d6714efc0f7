# hsdp_nccl_engine: the NCCL engine over the collective interface, with the
# fake NCCL (always built; tests run it on FakeDeviceApi).
add_library(hsdp_nccl_engine STATIC
  ${CMAKE_CURRENT_LIST_DIR}/fake_collectives.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl_engine_gate.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl_engine_shared.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl_engine_issue.cc
  ${CMAKE_CURRENT_LIST_DIR}/reduce_plan.cc)
target_include_directories(hsdp_nccl_engine PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_nccl_engine PUBLIC hsdp_device hsdp_shm hsdp_common
  absl::time absl::strings absl::status)

# hsdp_device_engine: engine.kind cpu / nccl / auto — routes tasks by memory kind.
add_library(hsdp_device_engine STATIC ${CMAKE_CURRENT_LIST_DIR}/../device_engine_factory.cc)
target_link_libraries(hsdp_device_engine PUBLIC hsdp_nccl_engine)
if(HSDP_CUDA_ENABLED)
  target_link_libraries(hsdp_device_engine PUBLIC hsdp_device_cuda)
endif()
