# The wheel's build (HSDP_PYTHON_ONLY, set by python_client/pyproject.toml):
# the libraries the extension links (proto/, client/) and the extension, for
# the interpreter scikit-build-core builds for. Included from the top-level
# CMakeLists.txt after its find_package calls; it returns right after.

# ccache when present: the extension, the client library and the generated
# gRPC code are minutes of compile on 2 cores; a rebuild with unchanged
# sources costs seconds.
find_program(HSDP_CCACHE ccache)
if(HSDP_CCACHE)
  foreach(lang C CXX)
    if(NOT CMAKE_${lang}_COMPILER_LAUNCHER)
      set(CMAKE_${lang}_COMPILER_LAUNCHER ${HSDP_CCACHE})
    endif()
  endforeach()
endif()

# abseil, gRPC and protobuf are linked shared, from Debian's packages: Debian's
# libprotobuf.a is not position-independent code (R_X86_64_TPOFF32 in
# arena.o), so it cannot go into a shared object, and a partly static link
# would still need bookworm's libprotobuf32 (docs/packaging.md, the ABI).

add_subdirectory(proto)
add_subdirectory(client)
add_subdirectory(python_client)
