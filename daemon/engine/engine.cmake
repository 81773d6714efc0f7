# The engine layer: the Engine interface (hsdp_engine_api), the NCCL engine
# and its binding (engine/nccl), the CPU and fake engines and the
# hierarchical cross-node engine (hsdp_engine), and the Gloo transport
# between daemons (hsdp_engine_gloo).
add_library(hsdp_engine_api STATIC ${CMAKE_CURRENT_LIST_DIR}/engine.cc)
target_include_directories(hsdp_engine_api PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_engine_api PUBLIC hsdp_shm hsdp_common absl::status absl::time)

# hsdp_nccl_engine: the NCCL engine over the collective interface, with the
# fake NCCL (always built; tests run it on FakeDeviceApi).
add_library(hsdp_nccl_engine STATIC
  ${CMAKE_CURRENT_LIST_DIR}/nccl/fake_collectives.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl/nccl_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl/nccl_engine_gate.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl/nccl_engine_shared.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl/nccl_engine_issue.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl/producer_gate.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl/reduce_plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl/shared_device_plan.cc)
target_include_directories(hsdp_nccl_engine PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_nccl_engine PUBLIC hsdp_engine_api hsdp_device hsdp_shm hsdp_common
  absl::time absl::strings absl::status)

# hsdp_nccl_cuda: the collective interface on the real libnccl, which is
# loaded at run time (nccl_library.h), never linked: the same binary starts
# on nodes without NCCL. The directory of the NCCL found here is one of the
# places searched.
if(HSDP_CUDA_ENABLED)
  add_library(hsdp_nccl_cuda STATIC ${CMAKE_CURRENT_LIST_DIR}/nccl/nccl_collectives.cc
    ${CMAKE_CURRENT_LIST_DIR}/nccl/nccl_library.cc)
  target_include_directories(hsdp_nccl_cuda SYSTEM PUBLIC ${NCCL_INCLUDE_DIR})
  target_include_directories(hsdp_nccl_cuda SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  get_filename_component(HSDP_NCCL_BUILD_DIR "${NCCL_LIBRARY}" DIRECTORY)
  target_compile_definitions(hsdp_nccl_cuda PRIVATE HSDP_NCCL_BUILD_DIR="${HSDP_NCCL_BUILD_DIR}")
  target_link_libraries(hsdp_nccl_cuda PUBLIC hsdp_nccl_engine hsdp_device_cuda ${CMAKE_DL_LIBS})
endif()

# hsdp_device_engine: engine.kind cpu / nccl / auto — routes tasks by memory kind.
add_library(hsdp_device_engine STATIC ${CMAKE_CURRENT_LIST_DIR}/device_engine_factory.cc)
target_link_libraries(hsdp_device_engine PUBLIC hsdp_nccl_engine)
if(HSDP_CUDA_ENABLED)
  target_link_libraries(hsdp_device_engine PUBLIC hsdp_nccl_cuda)
endif()

# hsdp_engine: every engine, and the factory that picks one from the config.
add_library(hsdp_engine STATIC
  ${CMAKE_CURRENT_LIST_DIR}/engine_factory.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake/fake_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/cpu_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/fair_queue.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/partial_reduce.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/thread_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/cross_node_all_gather.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/cross_node_all_reduce.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/cross_node_all_to_all.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/cross_node_broadcast.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/cross_node_ops.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/cross_node_reduce_scatter.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/cross_node_task.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/fake_transport.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/hierarchical_dependencies.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/hierarchical_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/hierarchical_links.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/node_transport.cc
  ${CMAKE_CURRENT_LIST_DIR}/crossnode/sidecar.cc)
target_link_libraries(hsdp_engine PUBLIC hsdp_engine_api hsdp_device_engine hsdp_cpu_kernels
  hsdp_config hsdp_util absl::synchronization absl::strings)
if(NOT HSDP_SANITIZE)  # as the kernels (kernels.cmake)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu/partial_reduce.cc
    PROPERTIES COMPILE_OPTIONS -O3)
endif()

# hsdp_engine_gloo: the transport between daemons on Gloo (TCP).
if(HSDP_GLOO_ENABLED)
  # gloo_peer_name.cc interposes one Gloo function (see its header): it must
  # end up in the executable, which a static library linked there does.
  add_library(hsdp_engine_gloo STATIC ${CMAKE_CURRENT_LIST_DIR}/crossnode/gloo_transport.cc
    ${CMAKE_CURRENT_LIST_DIR}/crossnode/gloo_peer_name.cc)
  target_link_libraries(hsdp_engine_gloo PUBLIC hsdp_engine gloo ${CMAKE_DL_LIBS})
endif()
