# hsdp_util: the injectable clock, the control executor, systemd notification, bounded key names,
# node-wide pools with per-uid shares
# (layer 0).
add_library(hsdp_util STATIC
  ${CMAKE_CURRENT_LIST_DIR}/clock.cc
  ${CMAKE_CURRENT_LIST_DIR}/constant_time.cc
  ${CMAKE_CURRENT_LIST_DIR}/executor.cc
  ${CMAKE_CURRENT_LIST_DIR}/sd_notify.cc
  ${CMAKE_CURRENT_LIST_DIR}/shortened_key.cc
  ${CMAKE_CURRENT_LIST_DIR}/uid_share.cc)
target_include_directories(hsdp_util PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_util PUBLIC hsdp_common absl::synchronization absl::time absl::strings
  Threads::Threads)
