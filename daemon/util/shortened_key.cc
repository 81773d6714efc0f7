#include "daemon/util/shortened_key.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace hsdp {

std::string ShortenedKey(const std::string& head, const std::string& tail, size_t max) {
  const std::string full = absl::StrCat(head, tail);
  if (full.size() <= max) return full;
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (unsigned char c : full) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrCat(full.substr(0, 64), "~", absl::Hex(h, absl::kZeroPad16), tail);
}

}  // namespace hsdp
