# The node's files and the Debian package (docs/packaging.md).
#
#   cmake --install build [--prefix P]     # binaries, client library, CMake
#                                          # package, hsdp.pc, unit, node.yaml
#   cmake --build build --target package   # build/packages/hsdpd_<v>_amd64.deb
#                                          # (tools/scripts/build_deb.sh)
#
# The binaries' and the client's install rules are next to their targets
# (daemon/CMakeLists.txt, tools/tools.cmake, client/CMakeLists.txt). Here: the
# default node.yaml and the systemd unit, whose place depends on the prefix
# chosen at install time (not at configure time): prefix /usr (the package)
# puts them in /etc/hsdpd and /lib/systemd/system, any other prefix P in
# P/etc/hsdpd and P/lib/systemd/system; the unit's ExecStart names P/bin/hsdpd
# and that node.yaml.
install(CODE "set(HSDP_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")
set(HSDP_PACKAGING_BINARY_DIR \"${CMAKE_BINARY_DIR}/packaging\")
set(HSDP_INSTALL_BINDIR \"${CMAKE_INSTALL_BINDIR}\")" COMPONENT daemon)
install(SCRIPT ${CMAKE_CURRENT_LIST_DIR}/install_node_files.cmake COMPONENT daemon)

# --- CPack DEB ------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME hsdpd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# tools/scripts/build_deb.sh --version V builds the same tree as another
# version (the upgrade test installs one over the other).
if(HSDP_DEB_VERSION)
  set(CPACK_PACKAGE_VERSION ${HSDP_DEB_VERSION})
endif()
set(CPACK_PACKAGE_CONTACT "hsdpd maintainers <hsdpd@users.noreply.github.com>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "per-node communication daemon for sharded data-parallel training")
set(CPACK_PACKAGE_DESCRIPTION
    "hsdpd runs one per node and carries the collectives of FSDP/HSDP/ZeRO jobs.\nThe package holds hsdpd, hsdpctl, hsdp-bench, the systemd unit (not enabled),\n/etc/hsdpd/node.yaml and the C++ client library (shared, static, headers,\nCMake package, pkg-config).")
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
# Install with DESTDIR and prefix /usr, so install_node_files.cmake sees /usr.
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/hsdpd/hsdpd")
# Runtime dependencies computed by dpkg-shlibdeps from what the binaries and
# libhsdp_client.so link: never listed by hand (deploy/docker/base-packages.txt
# is checked against them by tests/packaging/deb_test.py).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(HSDP_DEB_CONTROL_DIR ${CMAKE_BINARY_DIR}/packaging/debian)
foreach(f conffiles postinst prerm postrm)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/${f} ${HSDP_DEB_CONTROL_DIR}/${f} COPYONLY)
  list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${HSDP_DEB_CONTROL_DIR}/${f})
endforeach()
include(CPack)
