// Arguments from Python, checked and converted for the client library: dtype
// and reduce-op names, timeouts in seconds, the reduce options. Errors are
// raised as errors.h's exceptions (INVALID_ARGUMENT, naming the field).
// Must be called with the GIL held.
#ifndef HSDP_PYTHON_ARGUMENTS_H_
#define HSDP_PYTHON_ARGUMENTS_H_

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "hsdp/types.h"

namespace hsdp::python {

// An hsdp dtype name or alias; `field` names the argument in the error.
DataType ParseDtypeOrThrow(const std::string& name, const char* field);
// None or inf: no timeout; a negative or NaN value raises.
absl::Duration SecondsOrInfinite(std::optional<double> seconds);
ReduceOptions MakeReduceOptions(const std::string& op, double premul, double pre_divide,
                                double post_divide, const std::optional<std::string>& rdtype);

}  // namespace hsdp::python

#endif  // HSDP_PYTHON_ARGUMENTS_H_
