// Error-propagation macros: one per foreign error source, each adds file:line.
#ifndef HSDP_COMMON_STATUS_MACROS_H_
#define HSDP_COMMON_STATUS_MACROS_H_

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define HSDP_CONCAT_INNER_(a, b) a##b
#define HSDP_CONCAT_(a, b) HSDP_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                                      \
  do {                                                             \
    ::absl::Status hsdp_status_ = (expr);                          \
    if (!hsdp_status_.ok()) return hsdp_status_;                   \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());`
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(HSDP_CONCAT_(hsdp_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

namespace hsdp {

// Maps an errno value to the closest absl status code.
absl::StatusCode ErrnoToCode(int err);

// A status for a failed syscall: "<what>: <strerror> (errno N) [file:line]".
absl::Status ErrnoStatus(int err, std::string_view what, const char* file, int line);

}  // namespace hsdp

// Evaluates a syscall-style expression, retrying on EINTR; returns an error
// status naming the call when it returns -1.
#define SYSCALL_OR_RETURN(expr)                                                  \
  do {                                                                           \
    long hsdp_rc_;                                                               \
    do {                                                                         \
      hsdp_rc_ = static_cast<long>(expr);                                        \
    } while (hsdp_rc_ == -1 && errno == EINTR);                                  \
    if (hsdp_rc_ == -1) return ::hsdp::ErrnoStatus(errno, #expr, __FILE__, __LINE__); \
  } while (0)

#endif  // HSDP_COMMON_STATUS_MACROS_H_
