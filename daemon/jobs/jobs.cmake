# hsdp_jobs: the node's sessions, the jobs they form (owner and name), their
# groups and the groups' placement across nodes; device-buffer registration.
add_library(hsdp_jobs STATIC
  ${CMAKE_CURRENT_LIST_DIR}/device_registration.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_table.cc
  ${CMAKE_CURRENT_LIST_DIR}/node_ledger.cc
  ${CMAKE_CURRENT_LIST_DIR}/placement_waits.cc
  ${CMAKE_CURRENT_LIST_DIR}/retired_groups.cc
  ${CMAKE_CURRENT_LIST_DIR}/session_buffers.cc
  ${CMAKE_CURRENT_LIST_DIR}/session_groups.cc
  ${CMAKE_CURRENT_LIST_DIR}/session_manager.cc)
target_include_directories(hsdp_jobs PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_jobs PUBLIC hsdp_dataplane hsdp_session hsdp_engine_api hsdp_config
  hsdp_util absl::synchronization absl::time absl::strings)
