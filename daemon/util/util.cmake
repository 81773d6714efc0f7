# hsdp_util: the control executor and systemd notification (layer 0).
add_library(hsdp_util STATIC
  ${CMAKE_CURRENT_LIST_DIR}/executor.cc
  ${CMAKE_CURRENT_LIST_DIR}/sd_notify.cc)
target_include_directories(hsdp_util PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_util PUBLIC hsdp_common absl::synchronization absl::time
  Threads::Threads)
