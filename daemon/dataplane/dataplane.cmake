# hsdp_dataplane: descriptors read from the rings, validated, matched into
# group operations and handed to the engine.
add_library(hsdp_dataplane STATIC
  ${CMAKE_CURRENT_LIST_DIR}/agreement.cc
  ${CMAKE_CURRENT_LIST_DIR}/dispatcher.cc
  ${CMAKE_CURRENT_LIST_DIR}/group.cc
  ${CMAKE_CURRENT_LIST_DIR}/group_epochs.cc
  ${CMAKE_CURRENT_LIST_DIR}/group_p2p.cc
  ${CMAKE_CURRENT_LIST_DIR}/group_pipeline.cc
  ${CMAKE_CURRENT_LIST_DIR}/group_timeouts.cc
  ${CMAKE_CURRENT_LIST_DIR}/op_deadlines.cc
  ${CMAKE_CURRENT_LIST_DIR}/op_matcher.cc
  ${CMAKE_CURRENT_LIST_DIR}/small_op_arena.cc
  ${CMAKE_CURRENT_LIST_DIR}/validate.cc)
target_include_directories(hsdp_dataplane PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_dataplane PUBLIC hsdp_session hsdp_engine_api hsdp_shm hsdp_util
  absl::synchronization absl::time absl::strings)
