# Sanitizer and fuzzing builds (docs/security.md "Fuzzing and sanitizers";
# tools/scripts/run_hardening.sh makes them):
#   HSDP_SANITIZE=address,undefined  ASan + UBSan on every target we compile
#   HSDP_SANITIZE=thread             TSan
#   HSDP_FUZZ=ON                     libFuzzer coverage on every target and the
#                                    fuzz targets of tests/fuzz (with ASan+UBSan)
# Clang only. Debian's libraries (gRPC, protobuf, abseil, yaml-cpp, Gloo) are
# not instrumented: races and overflows inside them are not seen.
#
# Every executable and shared library links an object built here, at configure
# time, that carries the sanitizers' default options and suppressions
# (sanitizer_defaults.cc), so the tests, hsdpd and hsdpctl behave the same
# under ctest, a shell or a test that starts a daemon, with no environment
# set by hand. For TSan it also carries absl_tsan_shim.cc (abseil's Mutex,
# CondVar and Notification as TSan sees them; see that file).
set(HSDP_SANITIZE "" CACHE STRING
    "Sanitizers for every target: \"address,undefined\", \"thread\" or empty (none)")
option(HSDP_FUZZ "Build the libFuzzer targets of tests/fuzz (clang, with HSDP_SANITIZE=address,undefined)" OFF)

if(HSDP_FUZZ AND NOT HSDP_SANITIZE MATCHES "address")
  message(FATAL_ERROR "HSDP_FUZZ=ON needs HSDP_SANITIZE=address,undefined")
endif()
if(NOT HSDP_SANITIZE AND NOT HSDP_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "HSDP_SANITIZE / HSDP_FUZZ need clang (CC=clang CXX=clang++), not "
                      "${CMAKE_CXX_COMPILER_ID}")
endif()
if(HSDP_SANITIZE MATCHES "thread" AND HSDP_SANITIZE MATCHES "address")
  message(FATAL_ERROR "HSDP_SANITIZE: thread and address cannot be combined")
endif()

set(HSDP_SAN_FLAGS -fsanitize=${HSDP_SANITIZE} -fno-omit-frame-pointer)
if(HSDP_SANITIZE MATCHES "undefined")
  # Every UBSan finding is fatal (a test or fuzz run fails on it), and
  # unsigned overflow is not UB (the code relies on wrap-around on purpose).
  list(APPEND HSDP_SAN_FLAGS -fno-sanitize-recover=all)
endif()
if(HSDP_FUZZ)
  list(APPEND HSDP_SAN_FLAGS -fsanitize=fuzzer-no-link)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${HSDP_SAN_FLAGS}>")
add_link_options(-fsanitize=${HSDP_SANITIZE})

# The support object, compiled now with the same compiler and flags.
set(san_dir ${CMAKE_CURRENT_LIST_DIR})
set(san_sources ${san_dir}/sanitizer_defaults.cc)
if(HSDP_SANITIZE MATCHES "thread")
  list(APPEND san_sources ${san_dir}/absl_tsan_shim.cc)
endif()
set(san_objects)
foreach(src ${san_sources})
  get_filename_component(stem ${src} NAME_WE)
  # The source's hash in the name: an edited source changes every link
  # command, so ninja relinks what uses it (link options carry no dependency).
  file(MD5 ${src} hash)
  string(SUBSTRING ${hash} 0 12 hash)
  set(obj ${CMAKE_BINARY_DIR}/sanitizers/${stem}-${hash}.o)
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/sanitizers)
  execute_process(
    COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -O1 -g -fPIC -fsanitize=${HSDP_SANITIZE}
            -DHSDP_SANITIZE_SUPPRESSIONS_DIR="${san_dir}" -c ${src} -o ${obj}
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cannot compile ${src}: ${err}")
  endif()
  list(APPEND san_objects ${obj})
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src})
endforeach()
foreach(f lsan.supp tsan.supp ubsan.supp)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${san_dir}/${f})
endforeach()
add_link_options("$<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:${san_objects};-ldl>")
message(STATUS "hsdpd: sanitizers: ${HSDP_SANITIZE}; fuzz targets: ${HSDP_FUZZ}")
