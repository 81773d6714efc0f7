// Maps absl::Status to Python exceptions — the only place in the extension
// that does so.
//
// Exception hierarchy (all in hsdp._hsdp, re-exported by hsdp.errors):
//   HsdpError(Exception)                 .code (int), .code_name, .message
//     InvalidArgument(HsdpError, ValueError)
//     NotFound(HsdpError, LookupError)
//     AlreadyExists(HsdpError)
//     ResourceExhausted(HsdpError, MemoryError)
//     Unavailable(HsdpError, ConnectionError)
//     DeadlineExceeded(HsdpError, TimeoutError)
//     PermissionDenied(HsdpError, PermissionError)
//     FailedPrecondition(HsdpError)
//     Cancelled(HsdpError)
//     Aborted(HsdpError)
//     OutOfRange(HsdpError, IndexError)
//     Unimplemented(HsdpError, NotImplementedError)
//     Internal(HsdpError)
// Codes without a subclass (UNKNOWN, DATA_LOSS, UNAUTHENTICATED) raise HsdpError.
#ifndef HSDP_PYTHON_ERRORS_H_
#define HSDP_PYTHON_ERRORS_H_

#include <pybind11/pybind11.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hsdp::python {

// Creates the exception classes and adds them to `m`. Call once at import.
void RegisterErrors(pybind11::module_& m);

// Raises the Python exception for a non-OK `status` (throws
// pybind11::error_already_set). Must be called with the GIL held.
[[noreturn]] void ThrowStatus(const absl::Status& status);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  if (!v.ok()) ThrowStatus(v.status());
  return *std::move(v);
}

}  // namespace hsdp::python

#endif  // HSDP_PYTHON_ERRORS_H_
