// Node configuration: the key table (the schema) and YAML parsing and
// validation against it, from text or from a file. Scalar values are read by
// config_values.cc; rendering back to YAML is in node_config_yaml.cc; the
// cluster section, a schema of its own, is node_config_cluster.cc.
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


}  // namespace

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

std::span<const SectionSpec> NodeConfigSections() {
  static const SectionSpec kSections[] = {
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
      {"cluster", "multi-node control plane; see docs/cluster.md", ClusterKeys(), &CheckCluster},
  };
  return kSections;
}

}  // namespace config_internal
}  // namespace hsdp
