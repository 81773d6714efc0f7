# The etcd v3 client. Its gRPC stubs are generated from the proto files etcd
# publishes (Debian bookworm's golang-etcd-server-dev and the two packages its
# imports come from), which tools/scripts/etcd_env.sh extracts into
# HSDP_ETCD_DIR together with the etcd and etcdctl binaries the tests run.
set(HSDP_ETCD_DIR "${CMAKE_BINARY_DIR}/third_party/etcd" CACHE PATH
    "Where tools/scripts/etcd_env.sh puts etcd's protos and binaries")

set(HSDP_ETCD_GOCODE ${HSDP_ETCD_DIR}/usr/share/gocode/src)
# rpc.proto imports "etcd/mvcc/mvccpb/kv.proto": the directory that holds
# "etcd/" (go.etcd.io) is the proto path, so the import resolves unchanged.
set(HSDP_ETCD_PROTO_ROOT ${HSDP_ETCD_GOCODE}/go.etcd.io)
set(HSDP_ETCD_GOGO_ROOT ${HSDP_ETCD_GOCODE}/github.com/gogo/protobuf)
set(HSDP_ETCD_GOOGLEAPIS_ROOT
    ${HSDP_ETCD_GOCODE}/github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis)

# Each generated file: its proto path root and its name under that root.
set(HSDP_ETCD_PROTOS
  "${HSDP_ETCD_PROTO_ROOT}|etcd/etcdserver/etcdserverpb/rpc.proto"
  "${HSDP_ETCD_PROTO_ROOT}|etcd/mvcc/mvccpb/kv.proto"
  "${HSDP_ETCD_PROTO_ROOT}|etcd/auth/authpb/auth.proto"
  "${HSDP_ETCD_GOGO_ROOT}|gogoproto/gogo.proto"
  "${HSDP_ETCD_GOOGLEAPIS_ROOT}|google/api/annotations.proto"
  "${HSDP_ETCD_GOOGLEAPIS_ROOT}|google/api/http.proto")

set(HSDP_ETCD_MISSING FALSE)
foreach(entry ${HSDP_ETCD_PROTOS})
  string(REPLACE "|" "/" file "${entry}")
  if(NOT EXISTS "${file}")
    set(HSDP_ETCD_MISSING TRUE)
  endif()
endforeach()
if(NOT EXISTS "${HSDP_ETCD_DIR}/usr/bin/etcd")
  set(HSDP_ETCD_MISSING TRUE)
endif()
if(HSDP_ETCD_MISSING)
  execute_process(
    COMMAND ${PROJECT_SOURCE_DIR}/tools/scripts/etcd_env.sh ${HSDP_ETCD_DIR}
    RESULT_VARIABLE etcd_env_rc)
  if(NOT etcd_env_rc EQUAL 0)
    message(FATAL_ERROR
      "etcd's proto files and binaries are missing from HSDP_ETCD_DIR=${HSDP_ETCD_DIR} and "
      "tools/scripts/etcd_env.sh could not fetch them (exit ${etcd_env_rc}; see its message "
      "above). It needs apt-get access to Debian bookworm's golang-etcd-server-dev, "
      "golang-github-gogo-protobuf-dev, golang-github-grpc-ecosystem-grpc-gateway-dev, "
      "etcd-server and etcd-client; or point HSDP_ETCD_DIR at a directory holding them "
      "extracted with `dpkg -x`.")
  endif()
endif()

set(HSDP_ETCD_BINARY "${HSDP_ETCD_DIR}/usr/bin/etcd" CACHE FILEPATH
    "The etcd server binary the etcd tests run")
set(HSDP_ETCDCTL_BINARY "${HSDP_ETCD_DIR}/usr/bin/etcdctl" CACHE FILEPATH
    "The etcdctl binary the etcd tests use to enable authentication")

set(HSDP_ETCD_GEN ${CMAKE_BINARY_DIR}/etcd_gen)
file(MAKE_DIRECTORY ${HSDP_ETCD_GEN})
get_target_property(HSDP_ETCD_GRPC_PLUGIN gRPC::grpc_cpp_plugin LOCATION)
# google/protobuf/descriptor.proto (imported by gogo.proto) comes from the
# system's protobuf.
set(HSDP_ETCD_PROTO_PATHS
  --proto_path=${HSDP_ETCD_PROTO_ROOT}
  --proto_path=${HSDP_ETCD_GOGO_ROOT}
  --proto_path=${HSDP_ETCD_GOOGLEAPIS_ROOT})
foreach(dir ${Protobuf_INCLUDE_DIRS})
  list(APPEND HSDP_ETCD_PROTO_PATHS --proto_path=${dir})
endforeach()

set(HSDP_ETCD_PROTO_SRCS)
set(HSDP_ETCD_PROTO_FILES)
foreach(entry ${HSDP_ETCD_PROTOS})
  string(REPLACE "|" "/" file "${entry}")
  list(APPEND HSDP_ETCD_PROTO_FILES ${file})
endforeach()
foreach(entry ${HSDP_ETCD_PROTOS})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 1 rel)
  string(REPLACE "|" "/" file "${entry}")
  string(REGEX REPLACE "\\.proto$" "" stem ${rel})
  set(outs ${HSDP_ETCD_GEN}/${stem}.pb.cc ${HSDP_ETCD_GEN}/${stem}.pb.h
           ${HSDP_ETCD_GEN}/${stem}.grpc.pb.cc ${HSDP_ETCD_GEN}/${stem}.grpc.pb.h)
  add_custom_command(
    OUTPUT ${outs}
    COMMAND protobuf::protoc
      ${HSDP_ETCD_PROTO_PATHS}
      --cpp_out=${HSDP_ETCD_GEN}
      --grpc_out=${HSDP_ETCD_GEN}
      --plugin=protoc-gen-grpc=${HSDP_ETCD_GRPC_PLUGIN}
      ${rel}
    DEPENDS ${HSDP_ETCD_PROTO_FILES}
    COMMENT "protoc (etcd) ${rel}")
  list(APPEND HSDP_ETCD_PROTO_SRCS ${outs})
endforeach()

add_library(hsdp_etcd_proto STATIC ${HSDP_ETCD_PROTO_SRCS})
target_include_directories(hsdp_etcd_proto SYSTEM PUBLIC ${HSDP_ETCD_GEN})
target_link_libraries(hsdp_etcd_proto PUBLIC protobuf::libprotobuf gRPC::grpc++)
target_compile_options(hsdp_etcd_proto PRIVATE -w)

add_library(hsdp_etcd STATIC ${CMAKE_CURRENT_LIST_DIR}/etcd_client.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd_client_internal.cc ${CMAKE_CURRENT_LIST_DIR}/etcd_watch.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd_keepalive.cc)
target_include_directories(hsdp_etcd PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(hsdp_etcd
  PUBLIC absl::status absl::statusor absl::time
  PRIVATE hsdp_etcd_proto hsdp_common absl::synchronization absl::strings gRPC::grpc++)

target_link_libraries(hsdp_cluster PUBLIC hsdp_etcd)
