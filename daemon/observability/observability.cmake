# Observability (metrics, trace, straggler stats): part of hsdp_daemon_lib.
# The Prometheus endpoint needs prometheus-cpp (Debian prometheus-cpp-dev,
# installed by tools/scripts/bootstrap.sh); without it hsdpd builds, and
# `metrics.listen` is refused at start.
find_package(prometheus-cpp CONFIG QUIET)
set(HSDP_PROMETHEUS_ENABLED OFF)
if(prometheus-cpp_FOUND)
  set(HSDP_PROMETHEUS_ENABLED ON)
endif()
message(STATUS "hsdpd: Prometheus metrics (prometheus-cpp): ${HSDP_PROMETHEUS_ENABLED}")

target_sources(hsdp_daemon_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/observability.cc
  ${CMAKE_CURRENT_LIST_DIR}/observability_rpc.cc
  ${CMAKE_CURRENT_LIST_DIR}/op_labels.cc
  ${CMAKE_CURRENT_LIST_DIR}/straggler_stats.cc
  ${CMAKE_CURRENT_LIST_DIR}/trace_json.cc
  ${CMAKE_CURRENT_LIST_DIR}/trace_ring.cc)
if(HSDP_PROMETHEUS_ENABLED)
  target_sources(hsdp_daemon_lib PRIVATE ${CMAKE_CURRENT_LIST_DIR}/metrics.cc)
  target_link_libraries(hsdp_daemon_lib PUBLIC prometheus-cpp::pull prometheus-cpp::core)
  target_compile_definitions(hsdp_daemon_lib PUBLIC HSDP_HAVE_PROMETHEUS=1)
else()
  target_sources(hsdp_daemon_lib PRIVATE ${CMAKE_CURRENT_LIST_DIR}/metrics_stub.cc)
endif()
