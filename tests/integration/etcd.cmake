# The etcd client against a real 3-member etcd cluster on loopback (the etcd
# and etcdctl binaries that tools/scripts/etcd_env.sh extracted).
hsdp_add_test(etcd_client_test SOURCES etcd_client_test.cc
  LIBS hsdp_etcd hsdp_etcd_proto hsdp_common hsdp_proto absl::strings absl::time
  LABELS "integration;cluster;etcd")
target_compile_definitions(etcd_client_test PRIVATE
  HSDP_ETCD_BIN="${HSDP_ETCD_BINARY}" HSDP_ETCDCTL_BIN="${HSDP_ETCDCTL_BINARY}")
# EtcdJoin (the etcd membership's join protocol) against a real etcd.
hsdp_add_test(etcd_join_test SOURCES etcd_join_test.cc
  LIBS hsdp_cluster hsdp_etcd hsdp_common hsdp_proto absl::strings absl::time
  LABELS "integration;cluster;etcd")
target_compile_definitions(etcd_join_test PRIVATE
  HSDP_ETCD_BIN="${HSDP_ETCD_BINARY}" HSDP_ETCDCTL_BIN="${HSDP_ETCDCTL_BINARY}")
# The sweeper and the etcd member's sparse views and campaigns against a
# real etcd.
hsdp_add_test(etcd_sweeper_test SOURCES etcd_sweeper_test.cc
  LIBS hsdp_cluster hsdp_etcd hsdp_common hsdp_proto absl::strings absl::time
  LABELS "integration;cluster;etcd")
target_compile_definitions(etcd_sweeper_test PRIVATE
  HSDP_ETCD_BIN="${HSDP_ETCD_BINARY}" HSDP_ETCDCTL_BIN="${HSDP_ETCDCTL_BINARY}")
