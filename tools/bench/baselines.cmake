# Baselines for hsdp-bench's small-message latency (tools/bench/latency_compare.py):
#   mpi-bench  - the same collectives over Open MPI (built only when CMake finds MPI)
#   gloo-bench - the same collectives over Gloo's TCP transport on loopback
#                (built only when the build has Gloo, HSDP_GLOO_ENABLED)
# Neither links any hsdpd library.
find_package(MPI QUIET COMPONENTS CXX)
if(MPI_CXX_FOUND)
  add_executable(mpi-bench ${CMAKE_CURRENT_LIST_DIR}/mpi_bench.cc)
  target_link_libraries(mpi-bench PRIVATE MPI::MPI_CXX)
  # Only the C API is used: skip the deprecated C++ bindings' headers.
  target_compile_definitions(mpi-bench PRIVATE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
  message(STATUS "hsdpd: mpi-bench baseline: ON (MPI ${MPI_CXX_VERSION})")
else()
  message(STATUS "hsdpd: mpi-bench baseline: OFF (no MPI; apt-get install libopenmpi-dev)")
endif()

if(HSDP_GLOO_ENABLED)
  add_executable(gloo-bench ${CMAKE_CURRENT_LIST_DIR}/gloo_bench.cc)
  target_link_libraries(gloo-bench PRIVATE gloo)
endif()
