// Node configuration: YAML parsing, validation and rendering.
//
// The schema lives in one table (kSections below): each key names its parser,
// its renderer and a one-line comment, so parsing, NodeConfigToYaml and
// DefaultNodeConfigYaml cannot drift apart.
#include "daemon/config/node_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/common/unique_fd.h"
#include "yaml-cpp/yaml.h"

namespace hsdp {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;
constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

// A socket path must leave room for the terminating NUL in sun_path.
constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un{}.sun_path) - 1;
constexpr size_t kMaxNodeNameBytes = 255;
// Node configs are a few hundred bytes; this only stops `--node-config
// /dev/zero` from eating memory.
constexpr size_t kMaxConfigFileBytes = 1 << 20;
// Longest value quoted verbatim in an error message.
constexpr size_t kMaxQuotedBytes = 80;

// ---------------------------------------------------------------------------
// Text helpers.

// `text` in double quotes, C-escaped and truncated, for error messages.
std::string Quote(const std::string& text) {
  if (text.size() <= kMaxQuotedBytes) return absl::StrCat("\"", absl::CHexEscape(text), "\"");
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxQuotedBytes)), "...\"");
}

// `text` as a YAML double-quoted scalar that yaml-cpp reads back byte for
// byte (control characters become \xNN escapes; other bytes pass through).
std::string YamlQuote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char escape[5];
      std::snprintf(escape, sizeof(escape), "\\x%02x", c);
      out += escape;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Bytes in the unit that divides them exactly with the smallest quotient:
// 64 << 30 -> "64GiB", 65536 -> "64KiB", 10^12 -> "1TB", 1000 -> "1KB",
// 4097 -> "4097", 0 -> "0". ParseNodeConfig reads every result back.
std::string FormatSize(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {kTiB, "TiB"},  {1000ull * 1000 * 1000 * 1000, "TB"}, {kGiB, "GiB"},
      {1000ull * 1000 * 1000, "GB"}, {kMiB, "MiB"}, {1000ull * 1000, "MB"},
      {kKiB, "KiB"},  {1000, "KB"}};
  std::string best = absl::StrCat(bytes);
  if (bytes == 0) return best;
  uint64_t best_quotient = bytes;
  for (const auto& [unit, name] : kUnits) {
    if (bytes % unit == 0 && bytes / unit < best_quotient) {
      best_quotient = bytes / unit;
      best = absl::StrCat(best_quotient, name);
    }
  }
  return best;
}

// A mode in octal with a leading 0: 0660 -> "0660".
std::string FormatOctalMode(uint32_t mode) {
  char text[16];
  std::snprintf(text, sizeof(text), "0%o", static_cast<unsigned>(mode));
  return text;
}

// `text` without leading and trailing ASCII whitespace.
std::string_view TrimWhitespace(std::string_view text) {
  while (!text.empty() && absl::ascii_isspace(text.front())) text.remove_prefix(1);
  while (!text.empty() && absl::ascii_isspace(text.back())) text.remove_suffix(1);
  return text;
}

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
// Integers.

// The digits of a non-negative integer in `base`; `overflow` is set when the
// value does not fit in 64 bits.
struct Digits {
  uint64_t value = 0;
  bool overflow = false;
};

// Parses one or more digits of `base` (8 or 10), nothing else.
std::optional<Digits> ParseDigits(std::string_view text, unsigned base) {
  if (text.empty()) return std::nullopt;
  Digits out;
  for (char c : text) {
    const unsigned digit = static_cast<unsigned>(c - '0');
    if (c < '0' || digit >= base) return std::nullopt;
    if (out.value > (kNoLimit - digit) / base) out.overflow = true;
    out.value = out.value * base + digit;
  }
  return out;
}

// A decimal integer with optional sign, as written.
struct SignedDigits {
  bool negative = false;
  Digits magnitude;
};

std::optional<SignedDigits> ParseSignedDecimal(std::string_view text) {
  SignedDigits out;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    out.negative = text[0] == '-';
    text.remove_prefix(1);
  }
  std::optional<Digits> digits = ParseDigits(text, 10);
  if (!digits.has_value()) return std::nullopt;
  out.magnitude = *digits;
  return out;
}

// ---------------------------------------------------------------------------
// Values being parsed.

// Line (1-based) where `node` starts, or `fallback` when it has no position
// of its own (an empty value's mark points at the next token).
int LineOf(const YAML::Node& node, int fallback) {
  if (node.IsNull() || node.Mark().is_null()) return fallback;
  return node.Mark().line + 1;
}

// How a value looks, for "expected X, got Y" messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? absl::StrCat("the quoted string ", Quote(node.Scalar()))
                               : Quote(node.Scalar());
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    default:
      return "no value";
  }
}

// One value being parsed, with everything an error message needs.
struct Field {
  const std::string& source;  // "node.yaml"
  std::string path;           // "limits.max_sessions", "node.allowed_uids[2]"
  YAML::Node value;
  int line;  // 1-based

  // INVALID_ARGUMENT "<source>:<line>: <path>: <what>".
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", path, ": ", what));
  }
};

// OK when the field is a scalar (read it with f.value.Scalar()); otherwise an
// error saying that `expected` (e.g. "an integer") was expected instead of a
// map, a list or nothing.
absl::Status CheckScalar(const Field& f, const std::string& expected) {
  if (f.value.IsNull()) {
    return f.Error(absl::StrCat("missing value: expected ", expected,
                                " (remove the key to keep the default)"));
  }
  if (!f.value.IsScalar()) {
    return f.Error(absl::StrCat("expected ", expected, ", got ", Describe(f.value)));
  }
  return absl::OkStatus();
}

// An unquoted decimal integer in [min, max].
absl::StatusOr<uint64_t> IntegerInRange(const Field& f, uint64_t min, uint64_t max) {
  RETURN_IF_ERROR(CheckScalar(f, "an integer"));
  const std::string& text = f.value.Scalar();
  std::optional<SignedDigits> number;
  if (f.value.Tag() != "!") number = ParseSignedDecimal(text);  // "!" = quoted
  if (!number.has_value()) {
    return f.Error(absl::StrCat("expected an integer, got ", Describe(f.value)));
  }
  const uint64_t value = number->magnitude.value;
  const bool below = number->negative ? value != 0 : value < min;
  if (below || number->magnitude.overflow || value > max) {
    return f.Error(absl::StrCat("value ", Quote(text), " is out of range [", min, ", ", max, "]"));
  }
  return value;
}

template <typename T>
absl::Status SetInteger(const Field& f, uint64_t min, uint64_t max, T* out) {
  ASSIGN_OR_RETURN(const uint64_t value, IntegerInRange(f, min, max));
  *out = static_cast<T>(value);
  return absl::OkStatus();
}

// Bytes per unit; case-insensitive; "" and "B" are bytes. KiB.. are powers
// of 1024, KB.. powers of 1000.
std::optional<uint64_t> UnitMultiplier(std::string_view unit) {
  static constexpr std::pair<std::string_view, uint64_t> kUnits[] = {
      {"", 1},           {"b", 1},
      {"kib", kKiB},     {"mib", kMiB},       {"gib", kGiB},          {"tib", kTiB},
      {"kb", 1000},      {"mb", 1000 * 1000}, {"gb", 1000ull * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000}};
  const std::string lower = absl::AsciiStrToLower(std::string(unit));
  for (const auto& [name, multiplier] : kUnits) {
    if (lower == name) return multiplier;
  }
  return std::nullopt;
}

// A byte count: an integer or "<integer>[ ]<unit>" (see UnitMultiplier).
absl::StatusOr<uint64_t> SizeValue(const Field& f) {
  static constexpr char kExpected[] = "a size such as 65536, 512KiB, 64MiB or 8GiB";
  RETURN_IF_ERROR(CheckScalar(f, kExpected));
  const std::string& text = f.value.Scalar();
  std::string_view rest = TrimWhitespace(text);
  const bool negative = !rest.empty() && rest[0] == '-';
  if (negative || (!rest.empty() && rest[0] == '+')) rest.remove_prefix(1);
  const size_t digit_count =
      std::find_if(rest.begin(), rest.end(), [](char c) { return !absl::ascii_isdigit(c); }) -
      rest.begin();
  std::optional<Digits> number = ParseDigits(rest.substr(0, digit_count), 10);
  if (!number.has_value()) {
    return f.Error(absl::StrCat("expected ", kExpected, ", got ", Describe(f.value)));
  }
  if (negative && number->value != 0) {
    return f.Error(absl::StrCat("size ", Quote(text), " must not be negative"));
  }
  const std::string_view unit = TrimWhitespace(rest.substr(digit_count));
  if (!unit.empty() && unit[0] == '.') {
    return f.Error(absl::StrCat("size ", Quote(text),
                                " has a fraction; write a whole number of a smaller unit "
                                "(1536MiB, not 1.5GiB)"));
  }
  const std::optional<uint64_t> multiplier = UnitMultiplier(unit);
  if (!multiplier.has_value()) {
    return f.Error(absl::StrCat("unknown unit ", Quote(std::string(unit)), " in size ", Quote(text),
                                "; use B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB "
                                "(powers of 1000)"));
  }
  if (number->overflow || number->value > kNoLimit / *multiplier) {
    return f.Error(absl::StrCat("size ", Quote(text), " is too large (over 2^64 bytes)"));
  }
  return number->value * *multiplier;
}

// Allowed byte counts: [min, max], and also 0 when `zero_ok` (for limits
// where 0 means "automatic").
struct SizeRange {
  uint64_t min;
  uint64_t max;
  bool zero_ok;
};

absl::Status SetSize(const Field& f, SizeRange range, uint64_t* out) {
  ASSIGN_OR_RETURN(const uint64_t bytes, SizeValue(f));
  if ((bytes == 0 && range.zero_ok) || (bytes >= range.min && bytes <= range.max)) {
    *out = bytes;
    return absl::OkStatus();
  }
  std::string allowed =
      range.max == kNoLimit
          ? absl::StrCat("at least ", range.min, " bytes (", FormatSize(range.min), ")")
          : absl::StrCat("between ", FormatSize(range.min), " and ", FormatSize(range.max), " (",
                         range.max, " bytes)");
  if (range.zero_ok) allowed = absl::StrCat("0 or ", allowed);
  return f.Error(absl::StrCat("value ", Quote(f.value.Scalar()), " (", bytes,
                              " bytes) is out of range: must be ", allowed));
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

// An octal mode written with a leading 0 (YAML 1.1 style, 0660) or 0o (YAML
// 1.2 style, 0o660), quoted or not. A bare 660 is rejected: it is ambiguous.
absl::Status ParseSocketMode(const Field& f, NodeConfig* config) {
  static constexpr char kExpected[] = "an octal mode with a leading 0 such as 0660 or 0o660";
  RETURN_IF_ERROR(CheckScalar(f, kExpected));
  const std::string& text = f.value.Scalar();
  std::string_view digits = text;
  if (digits.size() >= 2 && digits[0] == '0' && (digits[1] == 'o' || digits[1] == 'O')) {
    digits.remove_prefix(2);
  } else if (digits.empty() || digits[0] != '0') {
    return f.Error(absl::StrCat("expected ", kExpected, ", got ", Describe(f.value)));
  }
  const std::optional<Digits> mode = ParseDigits(digits, 8);
  if (!mode.has_value()) {
    return f.Error(absl::StrCat("expected ", kExpected, ", got ", Describe(f.value)));
  }
  if (mode->overflow || mode->value > 0777) {
    return f.Error(absl::StrCat("value ", Quote(text), " is out of range [0, 0777]"));
  }
  config->socket_mode = static_cast<uint32_t>(mode->value);
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

// ---------------------------------------------------------------------------
// The schema.

using KeyParser = absl::Status (*)(const Field&, NodeConfig*);
using KeyRenderer = std::string (*)(const NodeConfig&);

struct KeySpec {
  std::string_view name;
  std::string_view comment;  // one line, for the rendered YAML
  KeyParser parse;
  KeyRenderer render;  // YAML text of the value
};

struct SectionSpec {
  std::string_view name;
  std::string_view comment;
  std::span<const KeySpec> keys;
};

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
};

constexpr KeySpec kLogKeys[] = {
    {"level", "debug, info, warning or error", &ParseLevel,
     &RenderString<&NodeConfig::log_level>},
};

constexpr SectionSpec kSections[] = {
    {"node", "this daemon and its control socket", kNodeKeys},
    {"engine", "the engine that runs collectives", kEngineKeys},
    {"limits", "per-session and per-node resource limits", kLimitsKeys},
    {"data_plane", "the shared-memory submission rings", kDataPlaneKeys},
    {"timeouts", "all in milliseconds", kTimeoutsKeys},
    {"log", "daemon logging (stderr)", kLogKeys},
};

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
                          NodeConfig* config) {
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
  for (const Entry& e : entries) {
    const SectionSpec* section = FindSection(e.key);
    if (section == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", e.line, ": ", absl::CHexEscape(e.key),
                       ": unknown top-level key ", Quote(e.key), Suggestion(e.key, {}, true),
                       " (known sections: ", SectionNames(), ")"));
    }
    RETURN_IF_ERROR(ParseSection(*section, e, source, config));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Rendering.

// Renders every key of `config` with its comment, after `header`.
std::string RenderYaml(const NodeConfig& config, std::string_view header) {
  static constexpr size_t kCommentColumn = 36;
  std::string out(header);
  for (const SectionSpec& section : kSections) {
    absl::StrAppend(&out, "\n", std::string(section.name), ":  # ",
                    std::string(section.comment), "\n");
    for (const KeySpec& key : section.keys) {
      std::string line = absl::StrCat("  ", std::string(key.name), ": ", key.render(config));
      line.resize(std::max(line.size() + 2, kCommentColumn), ' ');
      absl::StrAppend(&out, line, "# ", std::string(key.comment), "\n");
    }
  }
  return out;
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

absl::StatusOr<NodeConfig> ParseNodeConfig(std::string_view yaml_text, std::string_view source) {
  const std::string name = source.empty() ? "<config>" : std::string(source);
  NodeConfig config;
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(std::string(yaml_text));
    for (size_t i = 1; i < documents.size(); ++i) {
      if (documents[i].IsNull()) continue;  // a trailing "---" or "..."
      return absl::InvalidArgumentError(absl::StrCat(
          name, ":", LineOf(documents[i], 1),
          ": (top level): a second YAML document; a node config is a single document"));
    }
    if (!documents.empty()) RETURN_IF_ERROR(ParseDocument(documents[0], name, &config));
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    return absl::InvalidArgumentError(absl::StrCat(name, ":", line, ": YAML syntax error: ", e.msg));
  }
  return config;
}

absl::StatusOr<NodeConfig> LoadNodeConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadConfigFile(path));
  return ParseNodeConfig(text, path == "-" ? "<stdin>" : path);
}

std::string DefaultNodeConfigYaml() {
  return RenderYaml(
      NodeConfig{},
      "# hsdpd node configuration: the defaults (hsdpd --node-config FILE).\n"
      "# Every key is optional; a missing key keeps the value shown here. Unknown\n"
      "# keys are errors. Sizes take units: KiB, MiB, GiB, TiB (powers of 1024) or\n"
      "# KB, MB, GB, TB (powers of 1000). See docs/configuration.md.\n");
}

std::string NodeConfigToYaml(const NodeConfig& config) {
  return RenderYaml(config,
                    "# hsdpd node configuration (see docs/configuration.md for every key).\n");
}

std::string NodeConfigSummary(const NodeConfig& config) {
  return absl::StrCat(
      "engine=", config.engine_kind,
      " threads=", config.engine_threads == 0 ? "auto" : absl::StrCat(config.engine_threads),
      " ring_entries=", config.ring_entries, " spin_us=", config.spin_us,
      " collective_timeout_ms=", config.collective_timeout_ms,
      " max_sessions=", config.max_sessions,
      " max_session_bytes=", FormatSize(config.max_session_bytes),
      " max_node_bytes=", config.max_node_bytes == 0 ? "auto" : FormatSize(config.max_node_bytes),
      " log_level=", config.log_level);
}

}  // namespace hsdp
