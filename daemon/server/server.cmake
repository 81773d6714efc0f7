# hsdp_server: the top layer — gRPC services, the listeners, the data
# connection server and the Daemon that wires every layer together.
add_library(hsdp_server STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cluster_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/daemon.cc
  ${CMAKE_CURRENT_LIST_DIR}/data_conn_server.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_service.cc
  ${CMAKE_CURRENT_LIST_DIR}/grpc_services.cc
  ${CMAKE_CURRENT_LIST_DIR}/listener.cc)
target_include_directories(hsdp_server PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_server PUBLIC hsdp_observability hsdp_cluster hsdp_jobs hsdp_engine
  hsdp_auth hsdp_config hsdp_util hsdp_proto hsdp_shm hsdp_common
  absl::synchronization absl::time absl::strings gRPC::grpc++)
target_compile_definitions(hsdp_server PRIVATE HSDP_VERSION="${PROJECT_VERSION}")
# The cross-node engine when this build has Gloo (daemon/engine/crossnode/).
if(HSDP_GLOO_ENABLED)
  target_link_libraries(hsdp_server PUBLIC hsdp_cluster_gloo)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cluster_engine.cc
    PROPERTIES COMPILE_DEFINITIONS HSDP_HAVE_CLUSTER_ENGINE=1)
endif()
# The name the device-service tests link.
add_library(hsdp_device_service ALIAS hsdp_server)
