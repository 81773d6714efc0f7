// Minimal leveled logging to stderr with timestamps (abseil 20220623 has no
// absl/log). Thread-safe: each line is written with one write(2).
#ifndef HSDP_COMMON_LOGGING_H_
#define HSDP_COMMON_LOGGING_H_

#include <sstream>
#include <string_view>

namespace hsdp {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// "debug", "info", "warning", "error"; returns false for anything else.
bool ParseLogLevel(std::string_view name, LogLevel* out);

namespace internal {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal
}  // namespace hsdp

// Usage: HSDP_LOG(Info) << "x=" << x;  (safe inside an unbraced if/else)
#define HSDP_LOG(level)                                                              \
  for (bool hsdp_log_once_ = ::hsdp::LogLevel::k##level >= ::hsdp::GetLogLevel(); \
       hsdp_log_once_; hsdp_log_once_ = false)                                       \
  ::hsdp::internal::LogLine(::hsdp::LogLevel::k##level, __FILE__, __LINE__).stream()

#endif  // HSDP_COMMON_LOGGING_H_
