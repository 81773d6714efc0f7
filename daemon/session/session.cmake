# hsdp_session: one client's session — its shared-memory channel, mapped host
# buffers and device buffers.
add_library(hsdp_session STATIC
  ${CMAKE_CURRENT_LIST_DIR}/device_buffers.cc
  ${CMAKE_CURRENT_LIST_DIR}/mapped_buffer.cc
  ${CMAKE_CURRENT_LIST_DIR}/session.cc
  ${CMAKE_CURRENT_LIST_DIR}/shm_channel.cc)
target_include_directories(hsdp_session PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_session PUBLIC hsdp_device hsdp_shm hsdp_common
  absl::synchronization absl::status absl::strings)
# The name the device-buffer tests link.
add_library(hsdp_device_buffers ALIAS hsdp_session)
