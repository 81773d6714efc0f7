// Node configuration: the key table (the schema) and YAML parsing and
// validation against it, from text or from a file. Scalar values are read by
// config_values.cc; rendering back to YAML is in node_config_yaml.cc.
// Read whole: one table of sections and keys, each block next to its parsers.
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

// ---------------------------------------------------------------------------
// Suggestions.

// Levenshtein distance, for "did you mean" suggestions.
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
  // Whether "nccl" can run (built with CUDA, a GPU visible) is decided when
  // the daemon starts, with the reason in its error.
  if (kind == "cpu" || kind == "nccl" || kind == "auto") {
    config->engine_kind = kind;
    return absl::OkStatus();
  }
  return f.Error(absl::StrCat("unknown engine kind ", Quote(kind),
                              "; kinds: \"cpu\", \"nccl\", \"auto\""));
}

absl::Status ParseEngineDevice(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a device backend"));
  const std::string& device = f.value.Scalar();
  if (device == "cuda" || device == "fake") {
    config->engine_device = device;
    return absl::OkStatus();
  }
  return f.Error(absl::StrCat("unknown device backend ", Quote(device),
                              "; backends: \"cuda\", \"fake\" (tests only)"));
}

absl::Status ParseSpinMode(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a spin mode"));
  const std::string& mode = f.value.Scalar();
  if (mode == "yield" || mode == "pause") {
    config->spin_mode = mode;
    return absl::OkStatus();
  }
  return f.Error(absl::StrCat("unknown spin mode ", Quote(mode),
                              "; modes: \"yield\", \"pause\""));
}

absl::Status ParseSmallOpBytes(const Field& f, NodeConfig* config) {
  ASSIGN_OR_RETURN(const uint64_t bytes, IntegerInRange(f, 0, 1048576));
  if (bytes != 0 && (bytes < 64 || bytes % 64 != 0)) {
    return f.Error(absl::StrCat("value ", Quote(f.value.Scalar()),
                                " is not 0 or a multiple of 64 from 64 to 1048576"));
  }
  config->small_op_bytes = static_cast<uint32_t>(bytes);
  return absl::OkStatus();
}

absl::Status ParseSmallOpSlots(const Field& f, NodeConfig* config) {
  ASSIGN_OR_RETURN(const uint64_t slots, IntegerInRange(f, 1, 64));
  if ((slots & (slots - 1)) != 0) {
    return f.Error(absl::StrCat("value ", Quote(f.value.Scalar()),
                                " is not a power of two (1, 2, 4, ..., 64)"));
  }
  config->small_op_slots = static_cast<uint32_t>(slots);
  return absl::OkStatus();
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

// The user name of /metrics' basic auth: it travels as "user:password", so
// no ':'; printable, no spaces, so it survives any scrape config.
absl::Status ParseMetricsUsername(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "a user name"));
  const std::string& v = f.value.Scalar();
  bool ok = !v.empty() && v.size() <= 64;
  for (char c : v) ok = ok && c > ' ' && c < 0x7f && c != ':';
  if (!ok) {
    return f.Error(absl::StrCat("user name ", Quote(v),
                                " is not 1..64 printable characters without ':' or spaces"));
  }
  config->metrics_username = v;
  return absl::OkStatus();
}

absl::Status ParsePath(const Field& f, std::string* out);

// metrics.password_file and metrics.username need metrics.listen.
absl::Status CheckMetrics(const std::string& source,
                          const std::function<int(std::string_view)>& line_of,
                          const NodeConfig& c) {
  if (c.metrics_listen.empty() && !c.metrics_password_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", line_of("password_file"),
        ": metrics.password_file: set without metrics.listen (there is no endpoint to protect)"));
  }
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
std::string RenderBool(const NodeConfig& config) {
  return config.*kMember ? "true" : "false";
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
    {"kind", "collective engine: \"cpu\"; \"nccl\" (CPU + NCCL, needs a GPU); \"auto\" (NCCL when a GPU is visible)",
     &ParseEngineKind, &RenderString<&NodeConfig::engine_kind>},
    {"device", "device backend of nccl/auto: \"cuda\"; \"fake\" is TEST ONLY (host memory, CPU fake NCCL)",
     &ParseEngineDevice, &RenderString<&NodeConfig::engine_device>},
    {"threads", "worker threads, 0..1024; 0 = all cores this process may use",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 0, 1024, &c->engine_threads); },
     &RenderNumber<&NodeConfig::engine_threads>},
    {"inline_max_bytes", "ops up to this size run inline, skipping the pool; 0..64MiB",
     [](const Field& f, NodeConfig* c) {
       return SetSize(f, {.min = 0, .max = 64 * kMiB, .zero_ok = false}, &c->inline_max_bytes);
     },
     &RenderSize<&NodeConfig::inline_max_bytes>},
    {"bulk_nice", "nice increment of the threads running large ops, 0..19; small ops and "
                  "matching keep the daemon's priority",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 0, 19, &c->engine_bulk_nice); },
     &RenderNumber<&NodeConfig::engine_bulk_nice>},
    {"idle_lower_classes", "while a higher priority class is active, threads computing a lower "
                           "class's slices yield the CPU (SCHED_IDLE); true or false",
     [](const Field& f, NodeConfig* c) { return SetBool(f, &c->engine_idle_lower_classes); },
     &RenderBool<&NodeConfig::engine_idle_lower_classes>},
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
    {"max_job_bytes", "shared memory one job's sessions on this node may map; 0 = no per-job "
                      "limit, else >= 4KiB",
     [](const Field& f, NodeConfig* c) {
       return SetSize(f, {.min = 4096, .max = kNoLimit, .zero_ok = true}, &c->max_job_bytes);
     },
     &RenderSize<&NodeConfig::max_job_bytes>},
    {"max_job_ops_in_flight", "operations one job's sessions on this node may have in flight, "
                              "0..1000000000; 0 = only the rings bound them",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 0, 1000000000, &c->max_job_ops_in_flight);
     },
     &RenderNumber<&NodeConfig::max_job_ops_in_flight>},
    {"uid_share_percent", "the part of each node-wide pool (sessions, registered bytes, group "
                          "members, arena memory, placement waits) one uid other than root may "
                          "hold, 1..100",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 1, 100, &c->uid_share_percent); },
     &RenderNumber<&NodeConfig::uid_share_percent>},
};

constexpr KeySpec kJobsKeys[] = {
    {"priority_classes", "classes of service: [{name, level 0..7 (lower first), jobs: [patterns], "
                         "uids: [owners]}]; first match; none = \"default\", level 4",
     &ParsePriorityClasses, &RenderPriorityClasses},
};

constexpr KeySpec kDataPlaneKeys[] = {
    {"ring_entries", "submission ring slots per session, a power of two 16..65536",
     &ParseRingEntries, &RenderNumber<&NodeConfig::ring_entries>},
    {"spin_us", "busy-poll this long before sleeping, 0..100000 us",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 0, 100000, &c->spin_us); },
     &RenderNumber<&NodeConfig::spin_us>},
    {"spin_mode", "how spinning waits (the daemon's and its clients') share a CPU: \"yield\" "
                  "pauses a few polls, then yields between polls; \"pause\" never yields "
                  "(a dedicated CPU per spinner only)",
     &ParseSpinMode, &RenderString<&NodeConfig::spin_mode>},
    {"small_op_bytes", "operations of all-local groups with at most this many input bytes per "
                       "member run in the group's arena, without the daemon; 0 (off) or a "
                       "multiple of 64 up to 1048576",
     &ParseSmallOpBytes, &RenderNumber<&NodeConfig::small_op_bytes>},
    {"small_op_slots", "operations in flight per arena, a power of two 1..64",
     &ParseSmallOpSlots, &RenderNumber<&NodeConfig::small_op_slots>},
    {"small_op_arena_mib", "arena memory for the whole node, 0..1048576 MiB",
     [](const Field& f, NodeConfig* c) { return SetInteger(f, 0, 1048576, &c->small_op_arena_mib); },
     &RenderNumber<&NodeConfig::small_op_arena_mib>},
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
    {"password_file", "absolute path of the password scrapers give (HTTP basic auth), owned by "
                      "root or hsdpd's uid, mode 0600 or 0400; \"\" = no auth, and then only "
                      "node totals (no job ids, owners or ranks)",
     [](const Field& f, NodeConfig* c) { return ParsePath(f, &c->metrics_password_file); },
     &RenderString<&NodeConfig::metrics_password_file>},
    {"username", "user name of the basic auth, 1..64 printable bytes without ':' or spaces",
     &ParseMetricsUsername, &RenderString<&NodeConfig::metrics_username>},
    {"max_jobs_per_uid", "jobs of one owner uid with series of their own (of 256 on the node), "
                         "1..256; its other jobs share its job_id=\"_other\" series",
     [](const Field& f, NodeConfig* c) {
       return SetInteger(f, 1, 256, &c->metrics_max_jobs_per_uid);
     },
     &RenderNumber<&NodeConfig::metrics_max_jobs_per_uid>},
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

absl::Status ParseStore(const Field& f, NodeConfig* config) {
  RETURN_IF_ERROR(CheckScalar(f, "embedded or etcd"));
  const std::string& v = f.value.Scalar();
  if (v != "embedded" && v != "etcd") {
    return f.Error(absl::StrCat("expected embedded or etcd, got ", Quote(v)));
  }
  config->cluster_store = v;
  return absl::OkStatus();
}

// An absolute path without NUL bytes ("" allowed: unset).
absl::Status ParsePath(const Field& f, std::string* out) {
  RETURN_IF_ERROR(CheckScalar(f, "a file path"));
  const std::string& path = f.value.Scalar();
  if (!path.empty() && path[0] != '/') {
    return f.Error(absl::StrCat("path ", Quote(path), " is not absolute"));
  }
  if (path.find('\0') != std::string::npos) {
    return f.Error(absl::StrCat("path ", Quote(path), " contains a NUL byte"));
  }
  *out = path;
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

// --- end of cluster ---------------------------------------------------------

constexpr SectionSpec kSections[] = {
    {"node", "this daemon and its control socket", kNodeKeys},
    {"engine", "the engine that runs collectives", kEngineKeys},
    {"limits", "per-session and per-node resource limits", kLimitsKeys},
    {"jobs", "how jobs share the engine (see docs/qos.md)", kJobsKeys},
    {"data_plane", "the shared-memory submission rings", kDataPlaneKeys},
    {"timeouts", "all in milliseconds", kTimeoutsKeys},
    {"log", "daemon logging (stderr)", kLogKeys},
    {"metrics", "Prometheus metrics endpoint (see docs/observability.md)", kMetricsKeys,
     &CheckMetrics},
    {"trace", "operation trace for `hsdpctl trace`", kTraceKeys},
    {"cluster", "multi-node control plane; see docs/cluster.md", kClusterKeys, &CheckCluster},
};

}  // namespace

std::span<const SectionSpec> NodeConfigSections() { return kSections; }

}  // namespace config_internal
}  // namespace hsdp
