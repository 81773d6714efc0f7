# hsdp_daemon_lib: every daemon component (tests link it directly).
add_library(hsdp_daemon_lib STATIC
  ${CMAKE_CURRENT_LIST_DIR}/dataplane/dispatcher.cc
  ${CMAKE_CURRENT_LIST_DIR}/dataplane/group.cc
  ${CMAKE_CURRENT_LIST_DIR}/dataplane/group_p2p.cc
  ${CMAKE_CURRENT_LIST_DIR}/dataplane/validate.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/engine_factory.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/fake/fake_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/cpu/cpu_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/cpu/thread_pool.cc
  # engine/cluster: the cross-node data path (hierarchical engine, fake transport)
  ${CMAKE_CURRENT_LIST_DIR}/engine/cpu/partial_reduce.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/cluster/cross_node_ops.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/cluster/cross_node_task.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/cluster/fake_transport.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/cluster/hierarchical_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine/cluster/sidecar.cc
  ${CMAKE_CURRENT_LIST_DIR}/server/daemon.cc
  ${CMAKE_CURRENT_LIST_DIR}/server/data_conn_server.cc
  ${CMAKE_CURRENT_LIST_DIR}/server/grpc_services.cc
  ${CMAKE_CURRENT_LIST_DIR}/server/listener.cc
  ${CMAKE_CURRENT_LIST_DIR}/server/peer_registry.cc
  ${CMAKE_CURRENT_LIST_DIR}/session/job_table.cc
  ${CMAKE_CURRENT_LIST_DIR}/session/mapped_buffer.cc
  ${CMAKE_CURRENT_LIST_DIR}/session/session.cc
  ${CMAKE_CURRENT_LIST_DIR}/session/session_manager.cc
  ${CMAKE_CURRENT_LIST_DIR}/session/shm_channel.cc
  ${CMAKE_CURRENT_LIST_DIR}/util/executor.cc
  ${CMAKE_CURRENT_LIST_DIR}/server/authenticator.cc
  ${CMAKE_CURRENT_LIST_DIR}/util/sd_notify.cc
  # cluster: the multi-node control plane
  ${CMAKE_CURRENT_LIST_DIR}/cluster/cluster_client.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/cluster_member.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/cluster_node.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/cluster_service.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/coordinator.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/kv_cluster_directory.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/kv_store.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/nccl_id_exchange.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster/token_authenticator.cc)
target_include_directories(hsdp_daemon_lib PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_daemon_lib PUBLIC
  hsdp_config hsdp_cpu_kernels hsdp_common hsdp_proto hsdp_shm
  absl::synchronization absl::time absl::strings gRPC::grpc++)
# The GPU data path (docs/gpu.md): device buffers in the dataplane, engine
# selection (cpu / nccl / auto, cuda / fake), the DeviceMemory service.
# hsdp_device_service links hsdp_daemon_lib back (static libraries may cycle).
target_link_libraries(hsdp_daemon_lib PUBLIC hsdp_device_buffers hsdp_device_engine
  hsdp_device_service)
target_compile_definitions(hsdp_daemon_lib PRIVATE HSDP_VERSION="${PROJECT_VERSION}")
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/engine/cpu/partial_reduce.cc
  PROPERTIES COMPILE_OPTIONS -O3)

include(${CMAKE_CURRENT_LIST_DIR}/observability/observability.cmake)
# The Gloo rendezvous store over the coordinator's key/value store.
if(HSDP_GLOO_ENABLED)
  add_library(hsdp_cluster_gloo STATIC ${CMAKE_CURRENT_LIST_DIR}/cluster/gloo_store.cc
    ${CMAKE_CURRENT_LIST_DIR}/engine/cluster/gloo_transport.cc)
  target_link_libraries(hsdp_cluster_gloo PUBLIC hsdp_daemon_lib gloo)
endif()

# The daemon binary, with the cross-node engine when this build has one
# (Gloo and the hierarchical engine of daemon/engine/cluster/).
add_library(hsdp_cluster_engine STATIC ${CMAKE_CURRENT_LIST_DIR}/server/cluster_engine.cc)
target_link_libraries(hsdp_cluster_engine PUBLIC hsdp_daemon_lib)
if(HSDP_GLOO_ENABLED)
  target_link_libraries(hsdp_cluster_engine PUBLIC hsdp_cluster_gloo)
  target_compile_definitions(hsdp_cluster_engine PRIVATE HSDP_HAVE_CLUSTER_ENGINE=1)
endif()
add_executable(hsdpd ${CMAKE_CURRENT_LIST_DIR}/main.cc)
target_link_libraries(hsdpd PRIVATE hsdp_cluster_engine hsdp_daemon_lib)
