// Node configuration: the key table (the schema) and YAML parsing and
// validation against it, from text or from a file. Scalar values are read by
// config_values.cc; rendering back to YAML is in node_config_yaml.cc.
#include "daemon/config/node_config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <functional>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/config/config_values.h"
#include "daemon/config/node_config_schema.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/common/unique_fd.h"
#include "yaml-cpp/yaml.h"

namespace hsdp {
namespace config_internal {
namespace {

// A socket path must leave room for the terminating NUL in sun_path.
constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un{}.sun_path) - 1;
constexpr size_t kMaxNodeNameBytes = 255;
// Node configs are a few hundred bytes; this only stops `--node-config
// /dev/zero` from eating memory.
constexpr size_t kMaxConfigFileBytes = 1 << 20;

// ---------------------------------------------------------------------------
// Suggestions.

// Levenshtein distance, for "did you mean" suggestions.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

// True when `candidate` is close enough to the misspelt `typed` to suggest.
bool LooksLikeTypo(std::string_view typed, std::string_view candidate) {
  if (absl::EqualsIgnoreCase(std::string(typed), std::string(candidate))) return true;
  const size_t distance = EditDistance(typed, candidate);
  return distance <= 2 && 2 * distance < typed.size();
}

// ---------------------------------------------------------------------------
// Parsers for individual keys.

absl::Status ParseNodeName(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a string"));
  const std::string& name = f.value.Scalar();
  if (name.size() > kMaxNodeNameBytes) {
    return f.Error(absl::StrCat("name ", Quote(name), " is longer than ", kMaxNodeNameBytes,
                                " bytes"));
  }
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) {
      return f.Error(absl::StrCat("name ", Quote(name), " contains a control character"));
    }
  }
  config->node_name = name;
  return absl::OkStatus();
}

absl::Status ParseSocketPath(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a string"));
  const std::string& path = f.value.Scalar();
  if (!path.empty() && path[0] != '/') {
    return f.Error(absl::StrCat("socket path ", Quote(path),
                                " is not absolute (it must start with '/'; \"\" means the "
                                "default)"));
  }
  if (path.size() > kMaxSocketPathBytes) {
    return f.Error(absl::StrCat("socket path ", Quote(path), " is ", path.size(),
                                " bytes long; Unix socket paths must be shorter than ",
                                kMaxSocketPathBytes + 1, " bytes"));
  }
  if (path.find('\0') != std::string::npos) {
    return f.Error(absl::StrCat("socket path ", Quote(path), " contains a NUL byte"));
  }
  config->socket_path = path;
  return absl::OkStatus();
}

// An octal mode (see OctalModeValue).
absl::Status ParseSocketMode(const Field& f, NodeConfig* config) {
  ASSIGN_OR_RETURN(const uint32_t mode, OctalModeValue(f));
  config->socket_mode = mode;
  return absl::OkStatus();
}

absl::Status ParseAllowedUids(const Field& f, NodeConfig* config) {
  static constexpr uint64_t kMaxUid = 4294967294;  // (uid_t)-1 means "no uid"
  if (!f.value.IsSequence()) {
    return f.Error(
        absl::StrCat("expected a list of uids such as [1000, 1001], got ", Describe(f.value)));
  }
  std::vector<uid_t> uids;
  size_t index = 0;
  for (const YAML::Node& item : f.value) {
    const Field element{f.source, absl::StrCat(f.path, "[", index++, "]"), item,
                        LineOf(item, f.line)};
    ASSIGN_OR_RETURN(const uint64_t uid, IntegerInRange(element, 0, kMaxUid));
    uids.push_back(static_cast<uid_t>(uid));
  }
  config->allowed_uids = std::move(uids);
  return absl::OkStatus();
}

absl::Status ParseEngineKind(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "an engine kind"));
  const std::string& kind = f.value.Scalar();
  if (kind == "cpu") {
    config->engine_kind = kind;
    return absl::OkStatus();
  }
  if (kind == "nccl") {
    return f.Error(
        "engine \"nccl\" is not available: the NCCL engine is not built into hsdpd yet; the "
        "only supported kind is \"cpu\"");
  }
  return f.Error(absl::StrCat("unknown engine kind ", Quote(kind), "; the only supported kind is "
                              "\"cpu\""));
}

absl::Status ParseRingEntries(const Field& f, NodeConfig* config) {
  ASSIGN_OR_RETURN(const uint64_t entries, IntegerInRange(f, 16, 65536));
  if ((entries & (entries - 1)) != 0) {
    return f.Error(absl::StrCat("value ", Quote(f.value.Scalar()),
                                " is not a power of two (16, 32, 64, ..., 65536)"));
  }
  config->ring_entries = static_cast<uint32_t>(entries);
  return absl::OkStatus();
}

// Accepts the names ParseLogLevel knows and stores the canonical one.
absl::Status ParseLevel(const Field& f, NodeConfig* config) {
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
  RETURN_IF_ERROR(CheckScalar(f, "a log level"));
  const std::string& name = f.value.Scalar();
  LogLevel level;
  if (!ParseLogLevel(name, &level)) {
    return f.Error(absl::StrCat("unknown log level ", Quote(name),
                                "; use debug, info, warning or error"));
  }
  config->log_level = kNames[static_cast<int>(level)];
  return absl::OkStatus();
}

// "HOST:PORT" with an IPv4 host or a bracketed IPv6 host, or "" (off).
absl::Status ParseMetricsListen(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "\"HOST:PORT\" or \"\""));
  const std::string& v = f.value.Scalar();
  if (v.empty()) {
    config->metrics_listen.clear();
    return absl::OkStatus();
  }
  const size_t colon = v.rfind(':');
  const std::string hint =
      " (expected \"HOST:PORT\" such as \"127.0.0.1:9464\", or \"\" for off)";
  if (colon == std::string::npos) {
    return f.Error(absl::StrCat("address ", Quote(v), " is not HOST:PORT", hint));
  }
  if (colon == 0) return f.Error(absl::StrCat("address ", Quote(v), " names no host", hint));
  std::string host = v.substr(0, colon);
  const std::string port = v.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoul(port) > 65535) {
    return f.Error(absl::StrCat("address ", Quote(v), ": port ", Quote(port),
                                " is not a number in [0, 65535]", hint));
  }
  unsigned char buf[sizeof(in6_addr)];
  bool ok;
  if (host.front() == '[') {
    ok = host.size() > 2 && host.back() == ']' &&
         inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
  } else {
    ok = inet_pton(AF_INET, host.c_str(), buf) == 1;
  }
  if (!ok) {
    return f.Error(absl::StrCat("address ", Quote(v), ": host ", Quote(host),
                                " is not an IPv4 address or a bracketed IPv6 address", hint));
  }
  config->metrics_listen = v;
  return absl::OkStatus();
}

absl::Status ParseTraceBufferEvents(const Field& f, NodeConfig* config) {
  ASSIGN_OR_RETURN(const uint64_t n, IntegerInRange(f, 0, 4194304));
  if (n != 0 && n < 1024) {
    return f.Error(absl::StrCat("value ", Quote(f.value.Scalar()),
                                " is out of range: 0 (tracing off) or 1024..4194304"));
  }
  config->trace_buffer_events = static_cast<uint32_t>(n);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The schema.

// Renderers shared by several keys.
template <auto kMember>
std::string RenderNumber(const NodeConfig& config) {
  return absl::StrCat(config.*kMember);
}
template <auto kMember>
std::string RenderSize(const NodeConfig& config) {
  return FormatSize(config.*kMember);
}
template <auto kMember>
std::string RenderString(const NodeConfig& config) {
  return YamlQuote(config.*kMember);
}

std::string RenderUids(const NodeConfig& config) {
  std::string out = "[";
  for (size_t i = 0; i < config.allowed_uids.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", config.allowed_uids[i]);
  }
  return out + "]";
}

constexpr KeySpec kNodeKeys[] = {
    {"name", "name in logs and status; \"\" = the host name", &ParseNodeName,
     &RenderString<&NodeConfig::node_name>},
    {"socket", "control socket, absolute, < 108 bytes; \"\" = /run/hsdpd/hsdpd.sock or a "
               "per-user fallback",
     &ParseSocketPath, &RenderString<&NodeConfig::socket_path>},
    {"socket_mode", "permissions of the socket file, octal (0660 or 0o660), 0..0777",
     &ParseSocketMode, [](const NodeConfig& c) { return FormatOctalMode(c.socket_mode); }},
    {"allowed_uids", "uids that may connect, 0..4294967294; [] = the daemon's uid and root",
     &ParseAllowedUids, &RenderUids},
};

constexpr KeySpec kEngineKeys[] = {
    {"kind", "collective engine: \"cpu\" (the only one built)", &ParseEngineKind,
     &RenderString<&NodeConfig::engine_kind>},
    {"threads", "worker threads, 0..1024; 0 = all cores this process may use",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 0, 1024, &c->engine_threads); },
     &RenderNumber<&NodeConfig::engine_threads>},
    {"inline_max_bytes", "ops up to this size run inline, skipping the pool; 0..64MiB",
     [](const Field& f, NodeConfig* c) {
       return SetSize(f, {.min = 0, .max = 64 * kMiB, .zero_ok = false}, &c->inline_max_bytes);
     },
     &RenderSize<&NodeConfig::inline_max_bytes>},
};

constexpr KeySpec kLimitsKeys[] = {
    {"max_connections_per_uid", "live socket connections per uid, 1..65536; root is exempt",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 65536, &c->max_connections_per_uid);
     },
     &RenderNumber<&NodeConfig::max_connections_per_uid>},
    {"max_session_bytes", "shared memory one session may map; >= 4KiB",
     [](const Field& f, NodeConfig* c) {
       return SetSize(f, {.min = 4096, .max = kNoLimit, .zero_ok = false},
                      &c->max_session_bytes);
     },
     &RenderSize<&NodeConfig::max_session_bytes>},
    {"max_node_bytes", "shared memory all sessions may map; 0 = 90% of MemTotal, else >= 4KiB",
     [](const Field& f, NodeConfig* c) {
       return SetSize(f, {.min = 4096, .max = kNoLimit, .zero_ok = true}, &c->max_node_bytes);
     },
     &RenderSize<&NodeConfig::max_node_bytes>},
    {"max_sessions", "concurrent client sessions, 1..65536",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 1, 65536, &c->max_sessions); },
     &RenderNumber<&NodeConfig::max_sessions>},
    {"max_buffers_per_session", "registered buffers per session, 1..1000000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 1000000, &c->max_buffers_per_session);
     },
     &RenderNumber<&NodeConfig::max_buffers_per_session>},
    {"max_groups_per_job", "process groups per job, 1..1000000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 1000000, &c->max_groups_per_job);
     },
     &RenderNumber<&NodeConfig::max_groups_per_job>},
};

constexpr KeySpec kDataPlaneKeys[] = {
    {"ring_entries", "submission ring slots per session, a power of two 16..65536",
     &ParseRingEntries, &RenderNumber<&NodeConfig::ring_entries>},
    {"spin_us", "busy-poll this long before sleeping, 0..100000 us",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 0, 100000, &c->spin_us); },
     &RenderNumber<&NodeConfig::spin_us>},
};

constexpr KeySpec kTimeoutsKeys[] = {
    {"collective_ms", "a collective fails after this long, 1..86400000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 86400000, &c->collective_timeout_ms);
     },
     &RenderNumber<&NodeConfig::collective_timeout_ms>},
    {"data_connect_ms", "connecting to peer daemons gives up after this long, 1..600000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 600000, &c->data_connect_timeout_ms);
     },
     &RenderNumber<&NodeConfig::data_connect_timeout_ms>},
    {"shutdown_grace_ms", "on SIGTERM, wait this long for work to drain, 0..600000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 0, 600000, &c->shutdown_grace_ms);
     },
     &RenderNumber<&NodeConfig::shutdown_grace_ms>},
    {"hello_ms", "a new connection must finish its hello within this long, 1..600000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 600000, &c->hello_timeout_ms);
     },
     &RenderNumber<&NodeConfig::hello_timeout_ms>},
    {"idle_connection_ms", "close a gRPC connection idle this long, 100..86400000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 100, 86400000, &c->idle_connection_timeout_ms);
     },
     &RenderNumber<&NodeConfig::idle_connection_timeout_ms>},
};

constexpr KeySpec kLogKeys[] = {
    {"level", "debug, info, warning or error", &ParseLevel,
     &RenderString<&NodeConfig::log_level>},
};

constexpr KeySpec kMetricsKeys[] = {
    {"listen", "\"HOST:PORT\" for Prometheus /metrics (HTTP), e.g. \"127.0.0.1:9464\"; "
               "port 0 = any free; \"\" = off",
     &ParseMetricsListen, &RenderString<&NodeConfig::metrics_listen>},
};

constexpr KeySpec kTraceKeys[] = {
    {"buffer_events", "events kept for `hsdpctl trace` (~80 bytes each); 0 = off, "
                      "else 1024..4194304",
     &ParseTraceBufferEvents, &RenderNumber<&NodeConfig::trace_buffer_events>},
};
// --- cluster: the multi-node control plane (docs/cluster.md) ---------------

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

std::string HostOf(const std::string& host_port) {
  return host_port.substr(0, host_port.rfind(':'));
}

absl::Status CheckCluster(const std::string& source,
                          const std::function<int(std::string_view)>& line_of,
                          const NodeConfig& c) {
  const auto error = [&](std::string_view key, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", line_of(key), ": cluster.", std::string(key), ": ", what));
  };
  if (c.cluster_coordinator.empty()) {
    if (!c.cluster_listen.empty()) {
      return error("listen", "set without cluster.coordinator; name the coordinator's address "
                             "(on the coordinator itself, the same as cluster.listen)");
    }
    if (c.cluster_nodes != 1) {
      return error("nodes", "more than one node needs cluster.coordinator and cluster.listen");
    }
    return absl::OkStatus();
  }
  if (c.cluster_listen.empty()) {
    return error("coordinator", "cluster.listen (this daemon's peer address HOST:PORT) is "
                                "required when cluster.coordinator is set");
  }
  if (c.cluster_node_rank >= 0 && static_cast<uint32_t>(c.cluster_node_rank) >= c.cluster_nodes) {
    return error("node_rank", absl::StrCat("node rank ", c.cluster_node_rank,
                                           " is out of range for cluster.nodes ",
                                           c.cluster_nodes, " (0..", c.cluster_nodes - 1, ")"));
  }
  const bool tls = !c.cluster_tls_ca.empty();
  if (c.cluster_token_file.empty() && !tls && !c.cluster_insecure) {
    return error("coordinator",
                 "the peer channel has no authentication: set cluster.token_file to a shared "
                 "secret and/or cluster.tls, or cluster.insecure: true on a trusted network");
  }
  if ((!c.cluster_token_file.empty() || tls) && c.cluster_insecure) {
    return error("insecure", absl::StrCat("cluster.insecure: true contradicts cluster.",
                                          tls ? "tls" : "token_file", "; remove one of them"));
  }
  if (c.cluster_listen == c.cluster_coordinator && c.cluster_node_rank > 0) {
    return error("node_rank", "the coordinator is always node rank 0 (or leave node_rank unset)");
  }
  if (c.cluster_listen != c.cluster_coordinator && c.cluster_node_rank == 0) {
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

constexpr KeySpec kClusterKeys[] = {
    {"coordinator", "the coordinator's peer address HOST:PORT; \"\" = single node",
     [](const Field& f, NodeConfig* c) { return ParseHostPort(f, &c->cluster_coordinator); },
     &RenderString<&NodeConfig::cluster_coordinator>},
    {"listen", "this daemon's peer address HOST:PORT; = coordinator on the coordinator",
     [](const Field& f, NodeConfig* c) { return ParseHostPort(f, &c->cluster_listen); },
     &RenderString<&NodeConfig::cluster_listen>},
    {"nodes", "number of nodes in the cluster, 1..4096",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 1, 4096, &c->cluster_nodes); },
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
    {"missed_heartbeats", "a node silent this many intervals is lost, 1..1000",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 1000, &c->cluster_missed_heartbeats);
     },
     &RenderNumber<&NodeConfig::cluster_missed_heartbeats>},
};

// --- end of cluster ---------------------------------------------------------

constexpr SectionSpec kSections[] = {
    {"node", "this daemon and its control socket", kNodeKeys},
    {"engine", "the engine that runs collectives", kEngineKeys},
    {"limits", "per-session and per-node resource limits", kLimitsKeys},
    {"data_plane", "the shared-memory submission rings", kDataPlaneKeys},
    {"timeouts", "all in milliseconds", kTimeoutsKeys},
    {"log", "daemon logging (stderr)", kLogKeys},
    {"metrics", "Prometheus metrics endpoint (see docs/observability.md)", kMetricsKeys},
    {"trace", "operation trace for `hsdpctl trace`", kTraceKeys},
    {"cluster", "multi-node control plane; see docs/cluster.md", kClusterKeys, &CheckCluster},
};

}  // namespace

std::span<const SectionSpec> NodeConfigSections() { return kSections; }

namespace {

// "kind, threads, inline_max_bytes".
std::string KeyNames(std::span<const KeySpec> keys) {
  std::string out;
  for (const KeySpec& key : keys) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", std::string(key.name));
  }
  return out;
}

std::string SectionNames() {
  std::string out;
  for (const SectionSpec& s : kSections) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", std::string(s.name));
  }
  return out;
}

std::string DidYouMean(std::string_view name) {
  return absl::StrCat("; did you mean \"", std::string(name), "\"?");
}

// A hint for the unknown key `typed`: "; did you mean "threads"?" when it is
// close to a section name (if `include_sections`) or to one of `keys`;
// otherwise, when it is a key of some section, where it belongs; else "".
std::string Suggestion(std::string_view typed, std::span<const KeySpec> keys,
                       bool include_sections) {
  if (include_sections) {
    for (const SectionSpec& s : kSections) {
      if (LooksLikeTypo(typed, s.name)) return DidYouMean(s.name);
    }
  }
  for (const KeySpec& key : keys) {
    if (LooksLikeTypo(typed, key.name)) return DidYouMean(key.name);
  }
  for (const SectionSpec& s : kSections) {
    for (const KeySpec& key : s.keys) {
      if (typed == key.name) {
        const std::string section(s.name);
        return absl::StrCat("; \"", std::string(typed), "\" belongs in section \"", section,
                            "\" (", section, ".", std::string(typed), ")");
      }
    }
  }
  return "";
}

// ---------------------------------------------------------------------------
// Maps.

// One key/value pair of a YAML map.
struct Entry {
  std::string key;
  YAML::Node value;
  int line;  // of the key, 1-based
};

// The pairs of map `node` in document order. Rejects keys that are not
// scalars and keys that appear twice (yaml-cpp keeps both silently).
// `path` names the map in messages ("engine", or "(top level)").
absl::StatusOr<std::vector<Entry>> MapEntries(const YAML::Node& node, const std::string& source,
                                              const std::string& path, const std::string& prefix) {
  std::vector<Entry> entries;
  std::map<std::string, int> first_line;
  for (const auto& pair : node) {
    const int line = LineOf(pair.first, LineOf(node, 1));
    if (!pair.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", path,
                                                     ": keys must be strings, got ",
                                                     Describe(pair.first)));
    }
    const std::string key = pair.first.Scalar();
    const auto [it, inserted] = first_line.emplace(key, line);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", prefix,
                                                     absl::CHexEscape(key), ": duplicate key ",
                                                     Quote(key), " (first at line ", it->second,
                                                     ")"));
    }
    entries.push_back({key, pair.second, line});
  }
  return entries;
}

const KeySpec* FindKey(std::span<const KeySpec> keys, std::string_view name) {
  for (const KeySpec& key : keys) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

const SectionSpec* FindSection(std::string_view name) {
  for (const SectionSpec& s : kSections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// Parses the value of section `spec` (an `entry` of the top-level map). An
// empty section ("engine:" with every key commented out) keeps the defaults.
absl::Status ParseSection(const SectionSpec& spec, const Entry& entry, const std::string& source,
                          NodeConfig* config, std::map<std::string, int>* key_lines) {
  const std::string name(spec.name);
  if (entry.value.IsNull()) return absl::OkStatus();
  if (!entry.value.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", LineOf(entry.value, entry.line), ": ", name, ": expected a map with keys ",
        KeyNames(spec.keys), ", got ", Describe(entry.value)));
  }
  const std::string prefix = absl::StrCat(name, ".");
  ASSIGN_OR_RETURN(const std::vector<Entry> entries,
                   MapEntries(entry.value, source, name, prefix));
  for (const Entry& e : entries) {
    const KeySpec* key = FindKey(spec.keys, e.key);
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", e.line, ": ", prefix, absl::CHexEscape(e.key), ": unknown key ",
          Quote(e.key), " in section \"", name, "\"", Suggestion(e.key, spec.keys, false),
          " (known keys: ", KeyNames(spec.keys), ")"));
    }
    const Field field{source, prefix + e.key, e.value, LineOf(e.value, e.line)};
    RETURN_IF_ERROR(key->parse(field, config));
    (*key_lines)[e.key] = e.line;
  }
  return absl::OkStatus();
}

// Runs every section's cross-key check; `lines` maps a section present in
// the document to its line and its keys' lines.
absl::Status CheckSections(
    const std::string& source,
    const std::map<std::string, std::pair<int, std::map<std::string, int>>>& lines,
    const NodeConfig& config) {
  for (const SectionSpec& s : kSections) {
    if (s.check == nullptr) continue;
    const auto it = lines.find(std::string(s.name));
    const auto line_of = [&](std::string_view key) {
      if (it == lines.end()) return 1;
      const auto k = it->second.second.find(std::string(key));
      return k == it->second.second.end() ? it->second.first : k->second;
    };
    RETURN_IF_ERROR(s.check(source, line_of, config));
  }
  return absl::OkStatus();
}

// Parses a whole document; an empty one keeps every default.
absl::Status ParseDocument(const YAML::Node& root, const std::string& source, NodeConfig* config) {
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", LineOf(root, 1), ": (top level): expected a map of sections (",
        SectionNames(), "), got ", Describe(root)));
  }
  ASSIGN_OR_RETURN(const std::vector<Entry> entries, MapEntries(root, source, "(top level)", ""));
  // Per section: its line and the lines of its keys, for SectionSpec::check.
  std::map<std::string, std::pair<int, std::map<std::string, int>>> lines;
  for (const Entry& e : entries) {
    const SectionSpec* section = FindSection(e.key);
    if (section == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", e.line, ": ", absl::CHexEscape(e.key),
                       ": unknown top-level key ", Quote(e.key), Suggestion(e.key, {}, true),
                       " (known sections: ", SectionNames(), ")"));
    }
    auto& [section_line, key_lines] = lines[e.key];
    section_line = e.line;
    RETURN_IF_ERROR(ParseSection(*section, e, source, config, &key_lines));
  }
  return CheckSections(source, lines, *config);
}

// ---------------------------------------------------------------------------
// Files.

// The status for a failed open/read of `path`: NOT_FOUND, PERMISSION_DENIED,
// or INVALID_ARGUMENT for anything else.
absl::Status FileError(const std::string& path, const char* what, int err) {
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  if (err == ENOENT || err == ENOTDIR) code = absl::StatusCode::kNotFound;
  if (err == EACCES || err == EPERM) code = absl::StatusCode::kPermissionDenied;
  return absl::Status(code, absl::StrCat("cannot ", what, " node config ", Quote(path), ": ",
                                         std::strerror(err)));
}

// The whole content of `path` ("-" = standard input), at most
// kMaxConfigFileBytes.
absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  UniqueFd owned;
  int fd = STDIN_FILENO;
  if (path != "-") {
    do {
      owned.Reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    } while (!owned.valid() && errno == EINTR);
    if (!owned.valid()) return FileError(path, "open", errno);
    fd = owned.get();
  }
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("node config ", Quote(path), " is a directory"));
  }
  std::string text;
  char buffer[16 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(path, "read", errno);
    if (n == 0) return text;
    if (text.size() + static_cast<size_t>(n) > kMaxConfigFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat("node config ", Quote(path),
                                                     " is larger than ",
                                                     FormatSize(kMaxConfigFileBytes)));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace
}  // namespace config_internal

absl::StatusOr<NodeConfig> ParseNodeConfig(std::string_view yaml_text, std::string_view source) {
  const std::string name = source.empty() ? "<config>" : std::string(source);
  NodeConfig config;
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(std::string(yaml_text));
    for (size_t i = 1; i < documents.size(); ++i) {
      if (documents[i].IsNull()) continue;  // a trailing "---" or "..."
      return absl::InvalidArgumentError(absl::StrCat(
          name, ":", config_internal::LineOf(documents[i], 1),
          ": (top level): a second YAML document; a node config is a single document"));
    }
    if (!documents.empty()) {
      RETURN_IF_ERROR(config_internal::ParseDocument(documents[0], name, &config));
    }
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    return absl::InvalidArgumentError(absl::StrCat(name, ":", line, ": YAML syntax error: ", e.msg));
  }
  return config;
}

absl::StatusOr<NodeConfig> LoadNodeConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, config_internal::ReadConfigFile(path));
  return ParseNodeConfig(text, path == "-" ? "<stdin>" : path);
}

}  // namespace hsdp
