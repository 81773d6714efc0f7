# hsdp_auth: who is calling a gRPC method (the Authenticator interface, Unix
# peer credentials recorded by the listener).
add_library(hsdp_auth STATIC
  ${CMAKE_CURRENT_LIST_DIR}/authenticator.cc
  ${CMAKE_CURRENT_LIST_DIR}/peer_registry.cc)
target_include_directories(hsdp_auth PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_auth PUBLIC hsdp_common absl::synchronization absl::status
  absl::statusor absl::strings gRPC::grpc++)
