# Run by `cmake --install` (packaging.cmake): node.yaml and the systemd unit,
# placed for the prefix of this install. file(INSTALL) adds $DESTDIR.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(etc_dir /etc/hsdpd)
  set(unit_dir /lib/systemd/system)
else()
  set(etc_dir ${CMAKE_INSTALL_PREFIX}/etc/hsdpd)
  set(unit_dir ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)
endif()
file(INSTALL ${HSDP_SOURCE_DIR}/deploy/node.yaml DESTINATION ${etc_dir}
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# deploy/systemd/hsdpd.service names the package's paths; other prefixes get
# their own.
file(READ ${HSDP_SOURCE_DIR}/deploy/systemd/hsdpd.service unit)
string(REPLACE "/usr/bin/hsdpd" "${CMAKE_INSTALL_PREFIX}/${HSDP_INSTALL_BINDIR}/hsdpd" unit "${unit}")
string(REPLACE "/etc/hsdpd/node.yaml" "${etc_dir}/node.yaml" unit "${unit}")
file(WRITE ${HSDP_PACKAGING_BINARY_DIR}/unit/hsdpd.service "${unit}")
file(INSTALL ${HSDP_PACKAGING_BINARY_DIR}/unit/hsdpd.service DESTINATION ${unit_dir}
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
