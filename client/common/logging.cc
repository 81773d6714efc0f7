#include "hsdp/common/logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/str_cat.h"

namespace hsdp {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
const char kLevelChar[] = {'D', 'I', 'W', 'E'};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

bool ParseLogLevel(std::string_view name, LogLevel* out) {
  if (name == "debug") *out = LogLevel::kDebug;
  else if (name == "info") *out = LogLevel::kInfo;
  else if (name == "warning" || name == "warn") *out = LogLevel::kWarning;
  else if (name == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

std::string SummarizeList(const std::vector<int>& items, size_t max_items) {
  std::string out = "[";
  const size_t shown = std::min(items.size(), max_items);
  for (size_t i = 0; i < shown; ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", items[i]);
  if (shown < items.size()) {
    absl::StrAppend(&out, shown == 0 ? "" : ", ", "... (", items.size() - shown, " more)");
  }
  return out + "]";
}

namespace internal {

namespace {
std::atomic<LogClockFn> g_log_clock{nullptr};
}  // namespace

int64_t LogClockNanos() {
  if (LogClockFn fn = g_log_clock.load(std::memory_order_acquire); fn != nullptr) return fn();
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

LogClockFn SetLogClockForTesting(LogClockFn now_ns) {
  return g_log_clock.exchange(now_ns, std::memory_order_acq_rel);
}

bool LogRateLimiter::AllowAt(int64_t now, double period_seconds, uint64_t* suppressed) {
  int64_t next = next_allowed_ns_.load(std::memory_order_relaxed);
  const int64_t period_ns = static_cast<int64_t>(std::max(0.0, period_seconds) * 1e9);
  // Only the caller that moves the window forward logs; racing callers count
  // as suppressed.
  if (now < next ||
      !next_allowed_ns_.compare_exchange_strong(next, now + period_ns, std::memory_order_relaxed)) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

LogLine::LogLine(LogLevel level, const char* file, int line, uint64_t suppressed)
    : level_(level), suppressed_(suppressed) {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  char ts[64];
  std::snprintf(ts, sizeof(ts), "%04d-%02d-%02d %02d:%02d:%02d.%06ld", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long>(tv.tv_usec));
  const char* base = std::strrchr(file, '/');
  stream_ << kLevelChar[static_cast<int>(level)] << ' ' << ts << ' ' << getpid() << ' '
          << (base ? base + 1 : file) << ':' << line << "] ";
}

LogLine::~LogLine() {
  (void)level_;
  if (suppressed_ > 0) stream_ << " [" << suppressed_ << " similar messages suppressed]";
  stream_ << '\n';
  const std::string s = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

}  // namespace internal
}  // namespace hsdp
