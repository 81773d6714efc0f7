# hsdp-membership-sim: N simulated nodes speaking the real membership protocol
# (ClusterMember / EtcdMember) against a real store (hsdpd as the coordinator,
# or a 3-member etcd cluster); join time, steady load and loss detection.
add_executable(hsdp_membership_sim ${CMAKE_CURRENT_LIST_DIR}/membership_sim.cc
  ${CMAKE_CURRENT_LIST_DIR}/sim_process.cc ${CMAKE_CURRENT_LIST_DIR}/sim_stores.cc
  ${CMAKE_CURRENT_LIST_DIR}/sim_case.cc ${CMAKE_CURRENT_LIST_DIR}/sim_light.cc
  ${CMAKE_CURRENT_LIST_DIR}/sim_light_case.cc ${CMAKE_CURRENT_LIST_DIR}/sim_light_etcd.cc
  ${CMAKE_CURRENT_LIST_DIR}/sim_nodes.cc)
target_link_libraries(hsdp_membership_sim PRIVATE hsdp_cluster hsdp_etcd hsdp_etcd_proto hsdp_common
  absl::strings absl::time absl::status)
target_compile_definitions(hsdp_membership_sim PRIVATE
  HSDP_SIM_ETCD_BIN="${HSDP_ETCD_BINARY}")
set_target_properties(hsdp_membership_sim PROPERTIES OUTPUT_NAME hsdp-membership-sim)
