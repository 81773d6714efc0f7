#include "daemon/util/constant_time.h"

#include <algorithm>

namespace hsdp {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // The loop never stops early; the length difference is folded in.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace hsdp
