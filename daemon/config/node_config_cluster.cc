// The cluster section of node.yaml (docs/cluster.md): the multi-node
// control plane's keys (coordinator, listen addresses, ranks, credentials,
// TLS, the store and etcd), a schema of its own inside the node
// configuration's table (node_config_schema.h), and the checks across them.
#include <arpa/inet.h>

#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/config/config_values.h"
#include "daemon/config/node_config_schema.h"
#include "hsdp/common/status_macros.h"

namespace hsdp::config_internal {
namespace {

// A host name, an IPv4 address or a bracketed IPv6 address; empty = error.
bool ValidHost(const std::string& host) {
  if (host.empty() || host.size() > 253) return false;
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
    for (size_t i = 1; i + 1 < host.size(); ++i) {
      const char c = host[i];
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return false;
    }
    return true;
  }
  for (char c : host) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_') {
      return false;
    }
  }
  return true;
}

// "HOST:PORT" with PORT in 1..65535 ("" allowed: unset).
absl::Status ParseHostPort(const Field& f, std::string* out) {
  RETURN_IF_ERROR(CheckScalar(f, "an address \"HOST:PORT\""));
  const std::string& text = f.value.Scalar();
  if (text.empty()) {
    out->clear();
    return absl::OkStatus();
  }
  const size_t colon = text.rfind(':');
  const std::string host = colon == std::string::npos ? text : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (colon == std::string::npos || !ValidHost(host) ||
      (host.front() != '[' && host.find(':') != std::string::npos)) {
    return f.Error(absl::StrCat("address ", Quote(text),
                                " is not HOST:PORT (a host name, an IPv4 address or [IPv6], "
                                "then a port 1..65535)"));
  }
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) digits = digits && c >= '0' && c <= '9';
  if (!digits || std::stoul(port) < 1 || std::stoul(port) > 65535) {
    return f.Error(absl::StrCat("address ", Quote(text), ": port ", Quote(port),
                                " is not in 1..65535"));
  }
  *out = text;
  return absl::OkStatus();
}

absl::Status ParseDataAddress(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a host name or address"));
  const std::string& host = f.value.Scalar();
  if (!host.empty() && !ValidHost(host)) {
    return f.Error(absl::StrCat("data address ", Quote(host),
                                " is not a host name, an IPv4 address or [IPv6] (no port)"));
  }
  config->cluster_data_address = host;
  return absl::OkStatus();
}

absl::Status ParseNodeRank(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a node rank"));
  if (f.value.Scalar() == "-1" || f.value.Scalar() == "auto") {
    config->cluster_node_rank = -1;
    return absl::OkStatus();
  }
  return SetInteger(f, 0, 4095, &config->cluster_node_rank);
}

absl::Status ParseTokenFile(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a file path"));
  const std::string& path = f.value.Scalar();
  if (!path.empty() && path[0] != '/') {
    return f.Error(absl::StrCat("token file ", Quote(path), " is not an absolute path"));
  }
  if (path.find('\0') != std::string::npos) {
    return f.Error(absl::StrCat("token file ", Quote(path), " contains a NUL byte"));
  }
  config->cluster_token_file = path;
  return absl::OkStatus();
}

absl::Status ParseInsecure(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "true or false"));
  const std::string& v = f.value.Scalar();
  if (v == "true") {
    config->cluster_insecure = true;
  } else if (v == "false") {
    config->cluster_insecure = false;
  } else {
    return f.Error(absl::StrCat("expected true or false, got ", Quote(v)));
  }
  return absl::OkStatus();
}

// cluster.tls: {ca, cert, key}: absolute paths of PEM files for mutual TLS
// on the peer channel; all three or none.
absl::Status ParseTls(const Field& f, NodeConfig* config) {
  config->cluster_tls_ca.clear();
  config->cluster_tls_cert.clear();
  config->cluster_tls_key.clear();
  if (f.value.IsNull()) return absl::OkStatus();
  if (!f.value.IsMap()) {
    return f.Error(absl::StrCat("expected a map with keys ca, cert, key, got ", Describe(f.value)));
  }
  for (const auto& pair : f.value) {
    const std::string key = pair.first.IsScalar() ? pair.first.Scalar() : "";
    const Field sub{f.source, absl::StrCat(f.path, ".", absl::CHexEscape(key)), pair.second,
                    LineOf(pair.first, f.line)};
    std::string* out = key == "ca"     ? &config->cluster_tls_ca
                       : key == "cert" ? &config->cluster_tls_cert
                       : key == "key"  ? &config->cluster_tls_key
                                       : nullptr;
    if (out == nullptr) {
      return sub.Error(absl::StrCat("unknown key ", Quote(key), " (known keys: ca, cert, key)"));
    }
    RETURN_IF_ERROR(CheckScalar(sub, "a file path"));
    const std::string& path = sub.value.Scalar();
    if (!path.empty() && path[0] != '/') {
      return sub.Error(absl::StrCat("path ", Quote(path), " is not absolute"));
    }
    if (path.find('\0') != std::string::npos) {
      return sub.Error(absl::StrCat("path ", Quote(path), " contains a NUL byte"));
    }
    *out = path;
  }
  const int set = !config->cluster_tls_ca.empty() + !config->cluster_tls_cert.empty() +
                  !config->cluster_tls_key.empty();
  if (set != 0 && set != 3) {
    return f.Error("mutual TLS needs all of ca, cert and key (or none of them)");
  }
  return absl::OkStatus();
}

absl::Status ParseStore(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "embedded or etcd"));
  const std::string& v = f.value.Scalar();
  if (v != "embedded" && v != "etcd") {
    return f.Error(absl::StrCat("expected embedded or etcd, got ", Quote(v)));
  }
  config->cluster_store = v;
  return absl::OkStatus();
}

// cluster.etcd: {endpoints, prefix, user, password_file, tls: {ca, cert, key}}.
absl::Status ParseEtcd(const Field& f, NodeConfig* config) {
  const NodeConfig defaults;
  config->cluster_etcd_endpoints.clear();
  config->cluster_etcd_prefix = defaults.cluster_etcd_prefix;
  config->cluster_etcd_user.clear();
  config->cluster_etcd_password_file.clear();
  config->cluster_etcd_tls_ca.clear();
  config->cluster_etcd_tls_cert.clear();
  config->cluster_etcd_tls_key.clear();
  if (f.value.IsNull()) return absl::OkStatus();
  if (!f.value.IsMap()) {
    return f.Error(absl::StrCat("expected a map with keys endpoints, prefix, user, password_file, "
                                "tls, got ",
                                Describe(f.value)));
  }
  constexpr size_t kMaxEndpoints = 16;
  for (const auto& pair : f.value) {
    const std::string key = pair.first.IsScalar() ? pair.first.Scalar() : "";
    const Field sub{f.source, absl::StrCat(f.path, ".", absl::CHexEscape(key)), pair.second,
                    LineOf(pair.first, f.line)};
    if (key == "endpoints") {
      // [] = unset (what --print-default-config writes).
      if (!sub.value.IsSequence() || sub.value.size() > kMaxEndpoints) {
        return sub.Error(absl::StrCat("expected a list of up to ", kMaxEndpoints,
                                      " etcd client addresses HOST:PORT, got ",
                                      Describe(sub.value)));
      }
      for (size_t i = 0; i < sub.value.size(); ++i) {
        const Field item{f.source, absl::StrCat(sub.path, "[", i, "]"), sub.value[i],
                         LineOf(sub.value[i], sub.line)};
        std::string endpoint;
        RETURN_IF_ERROR(ParseHostPort(item, &endpoint));
        if (endpoint.empty()) return item.Error("an empty etcd endpoint");
        config->cluster_etcd_endpoints.push_back(endpoint);
      }
    } else if (key == "prefix") {
      RETURN_IF_ERROR(CheckScalar(sub, "a key prefix"));
      const std::string& prefix = sub.value.Scalar();
      bool printable = !prefix.empty() && prefix.size() <= 128;
      for (char c : prefix) printable = printable && c > ' ' && c < 0x7f;
      if (!printable) {
        return sub.Error(absl::StrCat("prefix ", Quote(prefix),
                                      " is not 1..128 printable characters without spaces"));
      }
      config->cluster_etcd_prefix = prefix.back() == '/' ? prefix : prefix + "/";
    } else if (key == "user") {
      RETURN_IF_ERROR(CheckScalar(sub, "an etcd user name"));
      if (sub.value.Scalar().size() > 128) return sub.Error("a user name of more than 128 bytes");
      config->cluster_etcd_user = sub.value.Scalar();
    } else if (key == "password_file") {
      RETURN_IF_ERROR(ParsePath(sub, &config->cluster_etcd_password_file));
    } else if (key == "tls") {
      if (sub.value.IsNull()) continue;
      if (!sub.value.IsMap()) {
        return sub.Error(absl::StrCat("expected a map with keys ca, cert, key, got ",
                                      Describe(sub.value)));
      }
      for (const auto& tls : sub.value) {
        const std::string tkey = tls.first.IsScalar() ? tls.first.Scalar() : "";
        const Field t{f.source, absl::StrCat(sub.path, ".", absl::CHexEscape(tkey)), tls.second,
                      LineOf(tls.first, sub.line)};
        std::string* out = tkey == "ca"     ? &config->cluster_etcd_tls_ca
                           : tkey == "cert" ? &config->cluster_etcd_tls_cert
                           : tkey == "key"  ? &config->cluster_etcd_tls_key
                                            : nullptr;
        if (out == nullptr) {
          return t.Error(absl::StrCat("unknown key ", Quote(tkey), " (known keys: ca, cert, key)"));
        }
        RETURN_IF_ERROR(ParsePath(t, out));
      }
      if (config->cluster_etcd_tls_ca.empty() &&
          (!config->cluster_etcd_tls_cert.empty() || !config->cluster_etcd_tls_key.empty())) {
        return sub.Error("a client certificate needs ca (the CA that signed etcd's certificate)");
      }
      if (config->cluster_etcd_tls_cert.empty() != config->cluster_etcd_tls_key.empty()) {
        return sub.Error("cert and key go together (or neither, for server-only TLS)");
      }
    } else {
      return sub.Error(absl::StrCat("unknown key ", Quote(key),
                                    " (known keys: endpoints, prefix, user, password_file, tls)"));
    }
  }
  if (config->cluster_etcd_user.empty() != config->cluster_etcd_password_file.empty()) {
    return f.Error("user and password_file go together (or neither)");
  }
  return absl::OkStatus();
}

std::string RenderEtcd(const NodeConfig& c) {
  std::string endpoints;
  for (size_t i = 0; i < c.cluster_etcd_endpoints.size(); ++i) {
    absl::StrAppend(&endpoints, i == 0 ? "" : ", ", YamlQuote(c.cluster_etcd_endpoints[i]));
  }
  return absl::StrCat("{endpoints: [", endpoints, "], prefix: ", YamlQuote(c.cluster_etcd_prefix),
                      ", user: ", YamlQuote(c.cluster_etcd_user),
                      ", password_file: ", YamlQuote(c.cluster_etcd_password_file),
                      ", tls: {ca: ", YamlQuote(c.cluster_etcd_tls_ca),
                      ", cert: ", YamlQuote(c.cluster_etcd_tls_cert),
                      ", key: ", YamlQuote(c.cluster_etcd_tls_key), "}}");
}

// The rules of cluster.store: etcd.
absl::Status CheckEtcd(const std::function<absl::Status(std::string_view, const std::string&)>& error,
                       const NodeConfig& c) {
  if (c.cluster_etcd_endpoints.empty()) {
    return error("store", "etcd needs cluster.etcd.endpoints (the etcd cluster's client "
                          "addresses HOST:PORT)");
  }
  if (!c.cluster_coordinator.empty()) {
    return error("coordinator", "there is no coordinator with cluster.store: etcd (the nodes "
                                "meet in etcd); remove cluster.coordinator");
  }
  if (!c.cluster_token_file.empty() || !c.cluster_tls_ca.empty()) {
    return error(c.cluster_tls_ca.empty() ? "token_file" : "tls",
                 "secures the embedded store's peer channel, which cluster.store: etcd does not "
                 "use; secure etcd with cluster.etcd.tls and cluster.etcd.user instead");
  }
  if (c.cluster_listen.empty()) {
    return error("store", "cluster.listen (this node's address HOST:PORT, its name in the "
                          "membership) is required");
  }
  const bool secured = !c.cluster_etcd_tls_ca.empty() || !c.cluster_etcd_user.empty();
  if (!secured && !c.cluster_insecure) {
    return error("etcd", "the connection to etcd has no authentication: set cluster.etcd.tls "
                         "and/or cluster.etcd.user, or cluster.insecure: true on a trusted "
                         "network");
  }
  if (secured && c.cluster_insecure) {
    return error("insecure", "cluster.insecure: true contradicts cluster.etcd's tls/user; "
                             "remove one of them");
  }
  return absl::OkStatus();
}

std::string HostOf(const std::string& host_port) {
  return host_port.substr(0, host_port.rfind(':'));
}

constexpr KeySpec kClusterKeys[] = {
    {"coordinator", "the coordinator's peer address HOST:PORT; \"\" = single node",
     [](const Field& f, NodeConfig* c) { return ParseHostPort(f, &c->cluster_coordinator); },
     &RenderString<&NodeConfig::cluster_coordinator>},
    {"listen", "this daemon's peer address HOST:PORT; = coordinator on the coordinator",
     [](const Field& f, NodeConfig* c) { return ParseHostPort(f, &c->cluster_listen); },
     &RenderString<&NodeConfig::cluster_listen>},
    {"nodes", "number of nodes in the cluster, 1..16384",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 1, 16384, &c->cluster_nodes); },
     &RenderNumber<&NodeConfig::cluster_nodes>},
    {"node_rank", "this node's rank 0..nodes-1; -1 = by join order (coordinator: 0)",
     &ParseNodeRank, &RenderNumber<&NodeConfig::cluster_node_rank>},
    {"data_address", "host peers reach this node's data plane at; \"\" = the listen host",
     &ParseDataAddress, &RenderString<&NodeConfig::cluster_data_address>},
    {"token_file", "absolute path of the shared secret sent with every peer call",
     &ParseTokenFile, &RenderString<&NodeConfig::cluster_token_file>},
    {"tls", "mutual TLS: PEM paths {ca, cert, key}, all or none", &ParseTls,
     [](const NodeConfig& c) {
       return absl::StrCat("{ca: ", YamlQuote(c.cluster_tls_ca), ", cert: ",
                           YamlQuote(c.cluster_tls_cert), ", key: ", YamlQuote(c.cluster_tls_key),
                           "}");
     }},
    {"insecure", "true = no peer authentication (trusted networks only)", &ParseInsecure,
     [](const NodeConfig& c) { return std::string(c.cluster_insecure ? "true" : "false"); }},
    {"join_timeout_ms", "give up joining the coordinator after this long, 1..3600000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 3600000, &c->cluster_join_timeout_ms);
     },
     &RenderNumber<&NodeConfig::cluster_join_timeout_ms>},
    {"heartbeat_ms", "heartbeat interval, 10..60000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 10, 60000, &c->cluster_heartbeat_ms);
     },
     &RenderNumber<&NodeConfig::cluster_heartbeat_ms>},
    {"store", "where membership and the key/value store live: embedded (the coordinator) "
              "or etcd (cluster.etcd)",
     &ParseStore, &RenderString<&NodeConfig::cluster_store>},
    {"etcd", "with store: etcd: {endpoints: [HOST:PORT, ...], prefix, user, password_file, "
             "tls: {ca, cert, key}}",
     &ParseEtcd, &RenderEtcd},
    {"missed_heartbeats", "a node silent this many intervals is lost, 1..1000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 1000, &c->cluster_missed_heartbeats);
     },
     &RenderNumber<&NodeConfig::cluster_missed_heartbeats>},
};

}  // namespace

absl::Status CheckCluster(const std::string& source,
                          const std::function<int(std::string_view)>& line_of,
                          const NodeConfig& c) {
  const auto error = [&](std::string_view key, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", line_of(key), ": cluster.", std::string(key), ": ", what));
  };
  if (c.cluster_store == "etcd") {
    RETURN_IF_ERROR(CheckEtcd(error, c));
  } else if (!c.cluster_etcd_endpoints.empty()) {
    return error("etcd", "set without cluster.store: etcd");
  } else if (c.cluster_coordinator.empty()) {
    if (!c.cluster_listen.empty()) {
      return error("listen", "set without cluster.coordinator; name the coordinator's address "
                             "(on the coordinator itself, the same as cluster.listen)");
    }
    if (c.cluster_nodes != 1) {
      return error("nodes", "more than one node needs cluster.coordinator and cluster.listen");
    }
    return absl::OkStatus();
  }
  if (c.cluster_store != "etcd" && c.cluster_listen.empty()) {
    return error("coordinator", "cluster.listen (this daemon's peer address HOST:PORT) is "
                                "required when cluster.coordinator is set");
  }
  if (c.cluster_node_rank >= 0 && static_cast<uint32_t>(c.cluster_node_rank) >= c.cluster_nodes) {
    return error("node_rank", absl::StrCat("node rank ", c.cluster_node_rank,
                                           " is out of range for cluster.nodes ",
                                           c.cluster_nodes, " (0..", c.cluster_nodes - 1, ")"));
  }
  const bool tls = !c.cluster_tls_ca.empty();
  if (c.cluster_store == "etcd") {
    // Ranks are claimed in etcd: any node may hold any rank.
  } else if (c.cluster_token_file.empty() && !tls && !c.cluster_insecure) {
    return error("coordinator",
                 "the peer channel has no authentication: set cluster.token_file to a shared "
                 "secret and/or cluster.tls, or cluster.insecure: true on a trusted network");
  }
  if ((!c.cluster_token_file.empty() || tls) && c.cluster_insecure) {
    return error("insecure", absl::StrCat("cluster.insecure: true contradicts cluster.",
                                          tls ? "tls" : "token_file", "; remove one of them"));
  }
  if (c.cluster_store == "etcd") {
    // No coordinator: no rank is reserved.
  } else if (c.cluster_listen == c.cluster_coordinator && c.cluster_node_rank > 0) {
    return error("node_rank", "the coordinator is always node rank 0 (or leave node_rank unset)");
  }
  if (c.cluster_store != "etcd" && c.cluster_listen != c.cluster_coordinator &&
      c.cluster_node_rank == 0) {
    return error("node_rank", "node rank 0 is the coordinator's; this daemon's cluster.listen "
                              "differs from cluster.coordinator");
  }
  if (!c.cluster_data_address.empty() || !HostOf(c.cluster_listen).empty()) {
    const std::string data = c.cluster_data_address.empty() ? HostOf(c.cluster_listen)
                                                            : c.cluster_data_address;
    if (data == "0.0.0.0" || data == "[::]") {
      return error("data_address", absl::StrCat("the data address would be ", Quote(data),
                                                ", which peers cannot connect to; set "
                                                "cluster.data_address to this node's address"));
    }
  }
  return absl::OkStatus();
}

std::span<const KeySpec> ClusterKeys() { return kClusterKeys; }

}  // namespace hsdp::config_internal
