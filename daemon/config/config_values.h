// Scalar values of the node configuration: reading integers, byte sizes
// (with units) and octal modes from YAML nodes with their error messages, and
// formatting them back. Internal to daemon/config.
#ifndef HSDP_DAEMON_CONFIG_CONFIG_VALUES_H_
#define HSDP_DAEMON_CONFIG_CONFIG_VALUES_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace hsdp::config_internal {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;
inline constexpr uint64_t kTiB = uint64_t{1} << 40;
inline constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

// ---------------------------------------------------------------------------
// Text.

// `text` in double quotes, C-escaped and truncated, for error messages.
std::string Quote(const std::string& text);

// `text` as a YAML double-quoted scalar that yaml-cpp reads back byte for
// byte (control characters become \xNN escapes; other bytes pass through).
std::string YamlQuote(const std::string& text);

// Bytes in the unit that divides them exactly with the smallest quotient:
// 64 << 30 -> "64GiB", 65536 -> "64KiB", 10^12 -> "1TB", 1000 -> "1KB",
// 4097 -> "4097", 0 -> "0". ParseNodeConfig reads every result back.
std::string FormatSize(uint64_t bytes);

// A mode in octal with a leading 0: 0660 -> "0660".
std::string FormatOctalMode(uint32_t mode);

// ---------------------------------------------------------------------------
// Values being parsed.

// Line (1-based) where `node` starts, or `fallback` when it has no position
// of its own (an empty value's mark points at the next token).
int LineOf(const YAML::Node& node, int fallback);

// How a value looks, for "expected X, got Y" messages.
std::string Describe(const YAML::Node& node);

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
absl::Status CheckScalar(const Field& f, const std::string& expected);

// An unquoted decimal integer in [min, max].
absl::StatusOr<uint64_t> IntegerInRange(const Field& f, uint64_t min, uint64_t max);

// An unquoted `true` or `false` (nothing else: not yes/no/on/off, which YAML
// 1.1 readers disagree on) stored into `*out`.
absl::Status SetBool(const Field& f, bool* out);

// IntegerInRange stored into `*out`.
template <typename T>
absl::Status SetInteger(const Field& f, uint64_t min, uint64_t max, T* out) {
  ASSIGN_OR_RETURN(const uint64_t value, IntegerInRange(f, min, max));
  *out = static_cast<T>(value);
  return absl::OkStatus();
}

// A byte count: an integer or "<integer>[ ]<unit>" (see UnitMultiplier).
absl::StatusOr<uint64_t> SizeValue(const Field& f);

// Allowed byte counts: [min, max], and also 0 when `zero_ok` (for limits
// where 0 means "automatic").
struct SizeRange {
  uint64_t min;
  uint64_t max;
  bool zero_ok;
};

// A byte count in `range` (see SizeValue) stored into `*out`.
absl::Status SetSize(const Field& f, SizeRange range, uint64_t* out);

// An octal mode in [0, 0777] written with a leading 0 (YAML 1.1 style, 0660)
// or 0o (YAML 1.2 style, 0o660), quoted or not. A bare 660 is rejected: it is
// ambiguous.
absl::StatusOr<uint32_t> OctalModeValue(const Field& f);

}  // namespace hsdp::config_internal

#endif  // HSDP_DAEMON_CONFIG_CONFIG_VALUES_H_
