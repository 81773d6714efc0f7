// What differs between two node configurations, key by key ("section.key",
// as docs/configuration.md names them): SIGHUP uses it to say which changes
// it applied and which need a restart.
#ifndef HSDP_DAEMON_CONFIG_CONFIG_DIFF_H_
#define HSDP_DAEMON_CONFIG_CONFIG_DIFF_H_

#include <string>
#include <vector>

#include "daemon/config/node_config.h"

namespace hsdp {

// The keys whose values differ, in the order of the configuration file.
std::vector<std::string> ChangedKeys(const NodeConfig& before, const NodeConfig& after);

// The keys a running hsdpd applies on SIGHUP (the rest need a restart).
inline const std::vector<std::string>& ReloadableKeys() {
  static const std::vector<std::string> keys = {"log.level", "node.allowed_uids"};
  return keys;
}

}  // namespace hsdp

#endif  // HSDP_DAEMON_CONFIG_CONFIG_DIFF_H_
