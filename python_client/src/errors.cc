#include "errors.h"

#include <array>
#include <string>

namespace hsdp::python {
namespace py = pybind11;
namespace {

constexpr int kNumCodes = 17;  // absl::StatusCode values 0..16

// Borrowed references kept alive by the module that owns them.
PyObject* g_base = nullptr;
std::array<PyObject*, kNumCodes> g_by_code{};

// Creates hsdp._hsdp.<name> deriving from HsdpError and, optionally, `builtin`.
PyObject* NewSubclass(py::module_& m, const char* name, PyObject* builtin, const char* doc) {
  const std::string qualified = std::string("hsdp._hsdp.") + name;
  // Two statements, not a ?: of two make_tuple calls: newer pybind11 (3.x)
  // gives make_tuple typed results of different types.
  py::tuple bases;
  if (builtin != nullptr) {
    bases = py::make_tuple(py::handle(g_base), py::handle(builtin));
  } else {
    bases = py::make_tuple(py::handle(g_base));
  }
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // steals nothing; the module keeps a reference
  return cls;
}

}  // namespace

void RegisterErrors(py::module_& m) {
  g_base = PyErr_NewExceptionWithDoc(
      "hsdp._hsdp.HsdpError",
      "An hsdpd operation failed. Attributes: code (absl status code, int), code_name "
      "(e.g. 'INVALID_ARGUMENT') and message (the daemon's or client's message).",
      PyExc_Exception, nullptr);
  if (g_base == nullptr) throw py::error_already_set();
  m.add_object("HsdpError", py::handle(g_base));
  g_by_code.fill(g_base);
  using C = absl::StatusCode;
  auto add = [&](C code, const char* name, PyObject* builtin, const char* doc) {
    g_by_code[static_cast<int>(code)] = NewSubclass(m, name, builtin, doc);
  };
  add(C::kCancelled, "Cancelled", nullptr,
      "The operation was cancelled (e.g. the client detached).");
  add(C::kInvalidArgument, "InvalidArgument", PyExc_ValueError, "A bad argument or option.");
  add(C::kDeadlineExceeded, "DeadlineExceeded", PyExc_TimeoutError, "A wait timed out.");
  add(C::kNotFound, "NotFound", PyExc_LookupError, "An unknown buffer, group or session.");
  add(C::kAlreadyExists, "AlreadyExists", nullptr, "E.g. a rank already attached in this job.");
  add(C::kPermissionDenied, "PermissionDenied", PyExc_PermissionError, "Refused by policy.");
  add(C::kResourceExhausted, "ResourceExhausted", PyExc_MemoryError, "Memory or queue limits.");
  add(C::kFailedPrecondition, "FailedPrecondition", nullptr, "Wrong state for this call.");
  add(C::kAborted, "Aborted", nullptr, "The operation was aborted (e.g. a member died).");
  add(C::kOutOfRange, "OutOfRange", PyExc_IndexError, "A value outside its range.");
  add(C::kUnimplemented, "Unimplemented", PyExc_NotImplementedError, "Not supported.");
  add(C::kInternal, "Internal", nullptr, "An internal error in hsdpd or the client.");
  add(C::kUnavailable, "Unavailable", PyExc_ConnectionError, "hsdpd cannot be reached.");
}

void ThrowStatus(const absl::Status& status) {
  const int code = static_cast<int>(status.code());
  PyObject* cls = (code >= 0 && code < kNumCodes) ? g_by_code[code] : g_base;
  const std::string message(status.message().data(), status.message().size());
  const std::string code_name = absl::StatusCodeToString(status.code());
  py::object exc = py::reinterpret_borrow<py::object>(cls)(py::str(message));
  exc.attr("code") = code;
  exc.attr("code_name") = code_name;
  exc.attr("message") = message;
  PyErr_SetObject(cls, exc.ptr());
  throw py::error_already_set();
}

}  // namespace hsdp::python
