# The cluster tests again on cluster.store: etcd: the same executables, run
# with HSDP_TEST_CLUSTER_STORE=etcd (cluster_test_util.h then starts a
# 3-member etcd cluster per test process and writes etcd configs), named
# "etcd.<suite>.<test>". Not in the sanitizer builds (the etcd client's own
# tests run there).
if(NOT HSDP_SANITIZE)
  hsdp_add_test(cluster_etcd_test SOURCES cluster_etcd_test.cc
    LIBS hsdp_client hsdp_cluster hsdp_proto hsdp_common hsdp_bench_util
    LABELS "integration;cluster;etcd")
  add_dependencies(cluster_etcd_test hsdpd hsdpctl)
  foreach(t cluster_datapath_test cluster_four_nodes_test cluster_job_identity_test
            cluster_membership_test cluster_etcd_test)
    target_compile_definitions(${t} PRIVATE
      HSDP_ETCD_BIN="${HSDP_ETCD_BINARY}" HSDP_ETCDCTL_BIN="${HSDP_ETCDCTL_BINARY}")
    target_link_libraries(${t} PRIVATE hsdp_etcd)
    if(NOT t STREQUAL "cluster_etcd_test")
      gtest_discover_tests(${t} TEST_PREFIX "etcd." TEST_LIST ${t}_etcd_TESTS
        DISCOVERY_TIMEOUT 60
        PROPERTIES TIMEOUT 300 ENVIRONMENT "HSDP_TEST_CLUSTER_STORE=etcd"
                   LABELS "integration-cluster-etcd")
    endif()
  endforeach()
endif()

# The etcd examples in deploy/ are valid configurations: the compose nodes'
# and the Kubernetes ConfigMap's (its NODE_IP placeholder filled in).
add_test(NAME cli.etcd_example_configs_are_valid
  COMMAND sh -c "set -e; for f in '${PROJECT_SOURCE_DIR}'/deploy/cluster/etcd/node0.yaml '${PROJECT_SOURCE_DIR}'/deploy/cluster/etcd/node1.yaml; do '${HSDPD}' --check-config \"$f\"; done; /usr/bin/python3 -c \"import sys, yaml; d = list(yaml.safe_load_all(open(sys.argv[1])))[-1]; print(d['data']['node.yaml'].replace('NODE_IP', '10.0.0.7'))\" '${PROJECT_SOURCE_DIR}/deploy/k8s/etcd.yaml' > '${CMAKE_CURRENT_BINARY_DIR}/k8s_etcd_node.yaml'; '${HSDPD}' --check-config '${CMAKE_CURRENT_BINARY_DIR}/k8s_etcd_node.yaml'")
set_tests_properties(cli.etcd_example_configs_are_valid PROPERTIES LABELS "integration;cli;etcd"
  TIMEOUT 60)
