#include "dlpack.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "errors.h"

namespace hsdp::python {
namespace py = pybind11;
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// Owns everything a DLManagedTensor points to.
struct ManagerCtx {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  PyObject* owner = nullptr;  // strong reference
  std::function<void()> on_release;
};

// DLPack deleter: may be called by the consumer from any thread, with or
// without the GIL.
void Deleter(DLManagedTensor* self) {
  auto* ctx = static_cast<ManagerCtx*>(self->manager_ctx);
  if (!Py_IsInitialized()) {  // interpreter gone: the memory goes with the process
    delete ctx;
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  if (ctx->on_release) ctx->on_release();
  Py_XDECREF(ctx->owner);
  delete ctx;
  PyGILState_Release(gil);
}

// Capsule destructor: frees the tensor only if no consumer took it (a
// consumer renames the capsule to "used_dltensor" and calls the deleter itself).
void CapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed == nullptr) {
    PyErr_Clear();
    return;
  }
  managed->deleter(managed);
}

}  // namespace

DLDataType DlpackDataType(const std::string& n) {
  if (n == "float32" || n == "fp32" || n == "float") return {kDLFloat, 32, 1};
  if (n == "float16" || n == "fp16" || n == "half") return {kDLFloat, 16, 1};
  if (n == "bfloat16" || n == "bf16") return {kDLBfloat, 16, 1};
  if (n == "float64" || n == "fp64" || n == "double") return {kDLFloat, 64, 1};
  if (n == "int64" || n == "long") return {kDLInt, 64, 1};
  if (n == "int32" || n == "int") return {kDLInt, 32, 1};
  if (n == "int16") return {kDLInt, 16, 1};
  if (n == "int8") return {kDLInt, 8, 1};
  if (n == "uint8") return {kDLUInt, 8, 1};
  if (n == "bool") return {kDLUInt, 8, 1};
  ThrowStatus(absl::InvalidArgumentError(
      "dtype '" + n +
      "' has no DLPack view; use one of float32, float16, bfloat16, float64, int64, int32, "
      "int16, int8, uint8"));
}

py::capsule MakeDlpackCapsule(void* data, const std::vector<int64_t>& shape, DLDataType dtype,
                              py::object owner, std::function<void()> on_release) {
  auto* ctx = new ManagerCtx();
  ctx->shape = shape;
  ctx->owner = owner.release().ptr();
  ctx->on_release = std::move(on_release);
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = dtype;
  t.shape = ctx->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = &Deleter;
  PyObject* cap = PyCapsule_New(&ctx->managed, kCapsuleName, &CapsuleDestructor);
  if (cap == nullptr) {
    Deleter(&ctx->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

}  // namespace hsdp::python
