# etcd's v3 gRPC API (KV, Lease, Watch), compiled at build time from the .proto files that
# Debian ships with etcd's sources (golang-etcd-server-dev), like mlaserve's own: the cluster
# membership talks to a real etcd with etcd's own messages (docs/cluster.md). Their imports
# (gogoproto's options, google.api's HTTP annotations) come from the packages that ship them;
# only descriptors are generated for those, since nothing calls them.
set(gocode /usr/share/gocode/src)
set(etcd_proto_roots
  ${gocode}/go.etcd.io
  ${gocode}/github.com/gogo/protobuf
  ${gocode}/github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis)
foreach(root IN LISTS etcd_proto_roots)
  if(NOT IS_DIRECTORY ${root})
    message(FATAL_ERROR "${root} is missing: scripts/install_deps.sh installs etcd's .proto files "
                        "(golang-etcd-server-dev and the packages of its imports)")
  endif()
endforeach()

set(etcd_protos
  etcd/etcdserver/etcdserverpb/rpc.proto
  etcd/mvcc/mvccpb/kv.proto
  etcd/auth/authpb/auth.proto
  gogoproto/gogo.proto
  google/api/annotations.proto
  google/api/http.proto)
set(etcd_generated_dir ${CMAKE_CURRENT_BINARY_DIR}/etcd_generated)
set(etcd_sources)
set(etcd_inputs)
foreach(proto IN LISTS etcd_protos)
  string(REGEX REPLACE "\\.proto$" "" stem ${proto})
  list(APPEND etcd_sources ${etcd_generated_dir}/${stem}.pb.cc ${etcd_generated_dir}/${stem}.pb.h)
  foreach(root IN LISTS etcd_proto_roots)
    if(EXISTS ${root}/${proto})
      list(APPEND etcd_inputs ${root}/${proto})
    endif()
  endforeach()
endforeach()
list(APPEND etcd_sources
  ${etcd_generated_dir}/etcd/etcdserver/etcdserverpb/rpc.grpc.pb.cc
  ${etcd_generated_dir}/etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h)
set(etcd_proto_path_args)
foreach(root IN LISTS etcd_proto_roots)
  list(APPEND etcd_proto_path_args --proto_path=${root})
endforeach()
add_custom_command(
  OUTPUT ${etcd_sources}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${etcd_generated_dir}
  # Only rpc.proto declares services; gRPC stubs for the others would be empty files.
  COMMAND protobuf::protoc ${etcd_proto_path_args} --proto_path=${Protobuf_INCLUDE_DIR}
          --cpp_out=${etcd_generated_dir} ${etcd_protos}
  COMMAND protobuf::protoc ${etcd_proto_path_args} --proto_path=${Protobuf_INCLUDE_DIR}
          --grpc_out=${etcd_generated_dir}
          --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>
          etcd/etcdserver/etcdserverpb/rpc.proto
  DEPENDS ${etcd_inputs} protobuf::protoc gRPC::grpc_cpp_plugin
  COMMENT "protoc etcd's v3 API (C++)"
  VERBATIM)

add_library(mlaserve_etcd_proto ${etcd_sources})
set_target_properties(mlaserve_etcd_proto PROPERTIES UNITY_BUILD OFF)  # as mlaserve_proto
target_include_directories(mlaserve_etcd_proto SYSTEM PUBLIC ${etcd_generated_dir})
target_link_libraries(mlaserve_etcd_proto PUBLIC protobuf::libprotobuf gRPC::grpc++)
