#include "hsdp/common/logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

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

namespace internal {

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
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
  stream_ << '\n';
  const std::string s = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

}  // namespace internal
}  // namespace hsdp
