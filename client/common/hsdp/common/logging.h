// Minimal leveled logging to stderr with timestamps (abseil 20220623 has no
// absl/log). Thread-safe: each line is written with one write(2).
#ifndef HSDP_COMMON_LOGGING_H_
#define HSDP_COMMON_LOGGING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace hsdp {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// "debug", "info", "warning", "error"; returns false for anything else.
bool ParseLogLevel(std::string_view name, LogLevel* out);

// A long list in one short line: the first `max_items` elements and how many
// were left out, e.g. SummarizeList({0..1048575}, 3) ==
// "[0, 1, 2, ... (1048573 more)]"; lists of at most `max_items` elements are
// printed whole ("[4, 5]", "[]").
std::string SummarizeList(const std::vector<int>& items, size_t max_items);

namespace internal {

class LogLine {
 public:
  // `suppressed` > 0 appends " [N similar messages suppressed]" to the line.
  LogLine(LogLevel level, const char* file, int line, uint64_t suppressed = 0);
  ~LogLine();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  uint64_t suppressed_;
  std::ostringstream stream_;
};

// The time the rate limiters read, in nanoseconds on a monotonic scale:
// CLOCK_MONOTONIC unless a test set another source.
using LogClockFn = int64_t (*)();
int64_t LogClockNanos();
// For tests: makes every rate limiter (HSDP_LOG_EVERY_N_SEC) read `now_ns`
// instead (nullptr: CLOCK_MONOTONIC again), so a test advances a fake time
// instead of sleeping through a period. Returns the previous source.
// Thread-safe; `now_ns` must be.
LogClockFn SetLogClockForTesting(LogClockFn now_ns);

// Lets one call site log at most once per period; counts what it dropped.
// Lock-free and thread-safe; constant-initialised, so it can be a
// function-local static without a guard.
class LogRateLimiter {
 public:
  constexpr LogRateLimiter() = default;
  // True when the caller may log now (then *suppressed is how many calls
  // were refused since the last allowed one); false otherwise.
  bool Allow(double period_seconds, uint64_t* suppressed) {
    return AllowAt(LogClockNanos(), period_seconds, suppressed);
  }
  // The same, at time `now_ns` (LogClockNanos' scale).
  bool AllowAt(int64_t now_ns, double period_seconds, uint64_t* suppressed);

 private:
  std::atomic<int64_t> next_allowed_ns_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace internal
}  // namespace hsdp

// Usage: HSDP_LOG(Info) << "x=" << x;  (safe inside an unbraced if/else)
#define HSDP_LOG(level)                                                              \
  for (bool hsdp_log_once_ = ::hsdp::LogLevel::k##level >= ::hsdp::GetLogLevel(); \
       hsdp_log_once_; hsdp_log_once_ = false)                                       \
  ::hsdp::internal::LogLine(::hsdp::LogLevel::k##level, __FILE__, __LINE__).stream()

// Like HSDP_LOG, but this call site writes at most one line per `seconds`
// (a double); the next line written says how many were dropped meanwhile.
// For anything a peer can trigger at will (per-connection warnings), so that
// a flood of bad connections cannot flood the log. The operands after << are
// not evaluated for dropped lines.
#define HSDP_LOG_EVERY_N_SEC(level, seconds)                                            \
  for (uint64_t hsdp_log_suppressed_ = 0, hsdp_log_once_ =                              \
           ::hsdp::LogLevel::k##level >= ::hsdp::GetLogLevel() &&                       \
           [] () -> ::hsdp::internal::LogRateLimiter& {                                 \
             static ::hsdp::internal::LogRateLimiter limiter;                           \
             return limiter;                                                            \
           }().Allow((seconds), &hsdp_log_suppressed_);                                 \
       hsdp_log_once_; hsdp_log_once_ = 0)                                              \
  ::hsdp::internal::LogLine(::hsdp::LogLevel::k##level, __FILE__, __LINE__,             \
                            hsdp_log_suppressed_)                                       \
      .stream()

#endif  // HSDP_COMMON_LOGGING_H_
