# hsdp-cluster-engine-bench: the cross-node engine over Gloo TCP on loopback
# next to plain Gloo (what torch's Gloo backend runs), same data, same run.
if(HSDP_GLOO_ENABLED)
  add_executable(hsdp_cluster_engine_bench ${CMAKE_CURRENT_LIST_DIR}/cluster_engine_bench.cc)
  target_link_libraries(hsdp_cluster_engine_bench PRIVATE hsdp_cluster_gloo)
  set_target_properties(hsdp_cluster_engine_bench PROPERTIES OUTPUT_NAME hsdp-cluster-engine-bench)
endif()
