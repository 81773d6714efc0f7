# hsdp_config: node configuration parsing and validation.
add_library(hsdp_config STATIC
  ${CMAKE_CURRENT_LIST_DIR}/config_diff.cc
  ${CMAKE_CURRENT_LIST_DIR}/config_values.cc
  ${CMAKE_CURRENT_LIST_DIR}/node_config.cc
  ${CMAKE_CURRENT_LIST_DIR}/node_config_cluster.cc
  ${CMAKE_CURRENT_LIST_DIR}/node_config_parser.cc
  ${CMAKE_CURRENT_LIST_DIR}/node_config_yaml.cc
  ${CMAKE_CURRENT_LIST_DIR}/priority_classes.cc
  ${CMAKE_CURRENT_LIST_DIR}/priority_classes_yaml.cc)
target_include_directories(hsdp_config PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_config PUBLIC hsdp_common yaml-cpp absl::status absl::statusor
  absl::strings)
