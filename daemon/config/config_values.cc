// Scalar values of the node configuration: integers, byte sizes with units,
// octal modes, and the quoting and formatting used in messages and YAML.
#include "daemon/config/config_values.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace hsdp::config_internal {
namespace {

// Longest value quoted verbatim in an error message.
constexpr size_t kMaxQuotedBytes = 80;

// `text` without leading and trailing ASCII whitespace.
std::string_view TrimWhitespace(std::string_view text) {
  while (!text.empty() && absl::ascii_isspace(text.front())) text.remove_prefix(1);
  while (!text.empty() && absl::ascii_isspace(text.back())) text.remove_suffix(1);
  return text;
}

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

}  // namespace

std::string Quote(const std::string& text) {
  if (text.size() <= kMaxQuotedBytes) return absl::StrCat("\"", absl::CHexEscape(text), "\"");
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxQuotedBytes)), "...\"");
}

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

std::string FormatOctalMode(uint32_t mode) {
  char text[16];
  std::snprintf(text, sizeof(text), "0%o", static_cast<unsigned>(mode));
  return text;
}

int LineOf(const YAML::Node& node, int fallback) {
  if (node.IsNull() || node.Mark().is_null()) return fallback;
  return node.Mark().line + 1;
}

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

absl::StatusOr<uint64_t> IntegerInRange(const Field& f, uint64_t min, uint64_t max) {
  RETURN_IF_ERROR(CheckScalar(f, "an integer"));
  const std::string& text = f.value.Scalar();
  std::optional<SignedDigits> number;
  if (f.value.Tag() != "!") number = ParseSignedDecimal(text);  // "!" = quoted
  if (!number.has_value()) {
    return f.Error(absl::StrCat("expected an integer, got ", Describe(f.value)));
  }
  const uint64_t value = number->magnitude.value;
  // "-0" is 0: below a minimum of 1 like "0" (found by node_config_fuzz:
  // accepted, then rendered as 0 and refused on reload).
  const bool below = (number->negative && value != 0) || value < min;
  if (below || number->magnitude.overflow || value > max) {
    return f.Error(absl::StrCat("value ", Quote(text), " is out of range [", min, ", ", max, "]"));
  }
  return value;
}

absl::Status SetBool(const Field& f, bool* out) {
  RETURN_IF_ERROR(CheckScalar(f, "true or false"));
  const std::string& text = f.value.Scalar();
  if (f.value.Tag() != "!" && (text == "true" || text == "false")) {
    *out = text == "true";
    return absl::OkStatus();
  }
  return f.Error(absl::StrCat("expected true or false, got ", Describe(f.value)));
}

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

absl::StatusOr<uint32_t> OctalModeValue(const Field& f) {
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
  return static_cast<uint32_t>(mode->value);
}

}  // namespace hsdp::config_internal
