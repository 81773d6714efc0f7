// Names that must fit a bounded key: the cluster's key/value store bounds key
// sizes, and the keys made from group keys (which list their ranks) can be
// longer. Used by the Gloo transport's store prefixes (engine) and by the
// cluster's own keys, so it lives below both.
#ifndef HSDP_DAEMON_UTIL_SHORTENED_KEY_H_
#define HSDP_DAEMON_UTIL_SHORTENED_KEY_H_

#include <cstddef>
#include <string>

namespace hsdp {

// `head` + `tail` when at most `max` bytes; else the first 64 bytes of it,
// "~", a hash of all of it, and `tail` (the part that must stay readable,
// e.g. an epoch).
std::string ShortenedKey(const std::string& head, const std::string& tail, size_t max = 200);

}  // namespace hsdp

#endif  // HSDP_DAEMON_UTIL_SHORTENED_KEY_H_
