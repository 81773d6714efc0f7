# hsdp_observability: metrics, traces, straggler statistics and their RPCs.
# The Prometheus endpoint needs prometheus-cpp (Debian prometheus-cpp-dev,
# installed by tools/scripts/bootstrap.sh); without it hsdpd builds, and
# `metrics.listen` is refused at start.
find_package(prometheus-cpp CONFIG QUIET)
set(HSDP_PROMETHEUS_ENABLED OFF)
if(prometheus-cpp_FOUND)
  set(HSDP_PROMETHEUS_ENABLED ON)
endif()
message(STATUS "hsdpd: Prometheus metrics (prometheus-cpp): ${HSDP_PROMETHEUS_ENABLED}")

add_library(hsdp_observability STATIC
  ${CMAKE_CURRENT_LIST_DIR}/observability.cc
  ${CMAKE_CURRENT_LIST_DIR}/observability_rpc.cc
  ${CMAKE_CURRENT_LIST_DIR}/op_labels.cc
  ${CMAKE_CURRENT_LIST_DIR}/series_sweeper.cc
  ${CMAKE_CURRENT_LIST_DIR}/straggler_stats.cc
  ${CMAKE_CURRENT_LIST_DIR}/trace_json.cc
  ${CMAKE_CURRENT_LIST_DIR}/trace_ring.cc)
target_include_directories(hsdp_observability PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_observability PUBLIC hsdp_jobs hsdp_dataplane hsdp_proto
  absl::synchronization absl::time absl::strings)
if(HSDP_PROMETHEUS_ENABLED)
  # metrics.cc is the facade; the parts it wires together each have a header.
  target_sources(hsdp_observability PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/metrics.cc
    ${CMAKE_CURRENT_LIST_DIR}/metrics_common.cc
    ${CMAKE_CURRENT_LIST_DIR}/metrics_server.cc
    ${CMAKE_CURRENT_LIST_DIR}/job_metrics.cc
    ${CMAKE_CURRENT_LIST_DIR}/node_totals.cc)
  target_link_libraries(hsdp_observability PUBLIC prometheus-cpp::pull prometheus-cpp::core)
  target_compile_definitions(hsdp_observability PUBLIC HSDP_HAVE_PROMETHEUS=1)
else()
  target_sources(hsdp_observability PRIVATE ${CMAKE_CURRENT_LIST_DIR}/metrics_stub.cc)
endif()
