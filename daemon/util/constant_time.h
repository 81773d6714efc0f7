// Comparing secrets (cluster tokens, the metrics password) without telling
// an attacker, through the time taken, where the first difference is.
#ifndef HSDP_DAEMON_UTIL_CONSTANT_TIME_H_
#define HSDP_DAEMON_UTIL_CONSTANT_TIME_H_

#include <string_view>

namespace hsdp {

// True when `a` equals `b`; compared over the longer length, so the time
// taken depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace hsdp

#endif  // HSDP_DAEMON_UTIL_CONSTANT_TIME_H_
