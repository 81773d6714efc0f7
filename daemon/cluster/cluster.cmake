# hsdp_cluster: the multi-node control plane — membership and the key/value
# store (embedded: the coordinator; or in etcd), peer authentication, NCCL id
# exchange.
add_library(hsdp_cluster STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cluster_client.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster_member.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster_node.cc
  ${CMAKE_CURRENT_LIST_DIR}/cluster_service.cc
  ${CMAKE_CURRENT_LIST_DIR}/coordinator.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd/etcd_join.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd/etcd_member.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd/etcd_member_watch.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd/etcd_sweeper.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd/etcd_store.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_cluster_directory.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_limits.cc
  ${CMAKE_CURRENT_LIST_DIR}/member_status.cc
  ${CMAKE_CURRENT_LIST_DIR}/member_view.cc
  ${CMAKE_CURRENT_LIST_DIR}/heartbeat_health.cc
  ${CMAKE_CURRENT_LIST_DIR}/join_retry.cc
  ${CMAKE_CURRENT_LIST_DIR}/node_snapshot.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_store.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl_id_exchange.cc
  ${CMAKE_CURRENT_LIST_DIR}/token_authenticator.cc)
target_include_directories(hsdp_cluster PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_cluster PUBLIC hsdp_jobs hsdp_engine hsdp_auth hsdp_config hsdp_proto
  absl::synchronization absl::time absl::strings absl::random_random gRPC::grpc++)

# The Gloo rendezvous store over the coordinator's key/value store, with the
# Gloo transport it serves.
if(HSDP_GLOO_ENABLED)
  add_library(hsdp_cluster_gloo STATIC ${CMAKE_CURRENT_LIST_DIR}/gloo_store.cc)
  target_link_libraries(hsdp_cluster_gloo PUBLIC hsdp_cluster hsdp_engine_gloo gloo)
endif()

# The etcd v3 client (stubs generated from etcd's own proto files).
include(${CMAKE_CURRENT_LIST_DIR}/etcd/etcd.cmake)
