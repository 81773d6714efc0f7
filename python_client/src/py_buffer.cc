#include "py_buffer.h"

#include <pybind11/stl.h>

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dlpack.h"
#include "errors.h"

namespace hsdp::python {
namespace py = pybind11;
namespace {

// Buffer-protocol slots that count exports (pybind11's own slots cannot).
int GetBufferSlot(PyObject* obj, Py_buffer* view, int flags) {
  view->obj = nullptr;
  PyBuffer* b = nullptr;
  try {
    b = py::handle(obj).cast<PyBuffer*>();
  } catch (const py::cast_error&) {
    PyErr_SetString(PyExc_BufferError, "not an hsdp Buffer");
    return -1;
  }
  if (b->freed()) {
    PyErr_SetString(PyExc_BufferError, absl::StrCat("hsdp Buffer ", b->id(), " was freed").c_str());
    return -1;
  }
  void* data = reinterpret_cast<void*>(b->address());
  if (PyBuffer_FillInfo(view, obj, data, static_cast<Py_ssize_t>(b->nbytes()), /*readonly=*/0,
                        flags) != 0) {
    return -1;
  }
  b->AddExport();
  return 0;
}

void ReleaseBufferSlot(PyObject* obj, Py_buffer* /*view*/) {
  try {
    py::handle(obj).cast<PyBuffer*>()->RemoveExport();
  } catch (const py::cast_error&) {
    PyErr_Clear();
  }
}

int64_t ElementBytes(DLDataType t) { return t.bits / 8; }

py::capsule Export(py::object self, uint64_t offset, int64_t nbytes, const std::string& dtype,
                   std::optional<std::vector<int64_t>> shape, py::object keepalive) {
  PyBuffer& b = self.cast<PyBuffer&>();
  b.CheckUsable();
  if (nbytes < 0) {
    if (offset > b.nbytes()) {
      ThrowStatus(absl::OutOfRangeError(absl::StrCat("offset ", offset, " is beyond buffer ",
                                                     b.id(), " of ", b.nbytes(), " bytes")));
    }
    nbytes = static_cast<int64_t>(b.nbytes() - offset);
  }
  void* data = b.Range(offset, static_cast<uint64_t>(nbytes));
  const DLDataType dt = DlpackDataType(dtype);
  const int64_t es = ElementBytes(dt);
  if (nbytes % es != 0) {
    ThrowStatus(absl::InvalidArgumentError(absl::StrCat(
        "nbytes ", nbytes, " is not a multiple of the ", dtype, " element size ", es)));
  }
  if (offset % es != 0) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("offset ", offset, " is not aligned to the ", dtype, " element size ", es)));
  }
  std::vector<int64_t> dims = shape.value_or(std::vector<int64_t>{nbytes / es});
  int64_t elems = 1;
  for (int64_t d : dims) {
    if (d < 0) ThrowStatus(absl::InvalidArgumentError("shape: negative dimension"));
    elems *= d;
  }
  if (elems * es != nbytes) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("shape holds ", elems * es, " bytes but the view is ", nbytes, " bytes")));
  }
  PyBuffer* raw = &b;
  b.AddExport();
  // The Python Buffer (and `keepalive`) stay referenced until the consumer
  // releases the tensor.
  py::object owner = keepalive.is_none() ? self : py::make_tuple(self, keepalive);
  return MakeDlpackCapsule(data, dims, dt, owner, [raw] { raw->RemoveExport(); });
}

}  // namespace

void PyBuffer::CheckUsable() const {
  if (freed_) {
    ThrowStatus(
        absl::FailedPreconditionError(absl::StrCat("hsdp Buffer ", buffer_.id, " was freed")));
  }
}

void* PyBuffer::Range(uint64_t offset, uint64_t nbytes) const {
  CheckUsable();
  if (offset > buffer_.size || nbytes > buffer_.size - offset) {
    ThrowStatus(absl::OutOfRangeError(absl::StrCat("range [", offset, ", ", offset + nbytes,
                                                   ") is outside buffer ", buffer_.id, " of ",
                                                   buffer_.size, " bytes")));
  }
  return static_cast<char*>(buffer_.data) + offset;
}

void PyBuffer::Free() {
  if (freed_) return;
  if (exports_ > 0) {
    ThrowStatus(absl::FailedPreconditionError(absl::StrCat(
        "hsdp Buffer ", buffer_.id, " still has ", exports_,
        " exported view(s) (arrays, tensors or memoryviews); drop them before free()")));
  }
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->FreeBuffer(buffer_.id);
  }
  freed_ = true;
  ThrowIfError(s);
}

void BindBuffer(py::module_& m) {
  py::class_<PyBuffer> cls(m, "Buffer", py::buffer_protocol(), R"doc(
A host buffer shared with hsdpd (zero-filled at allocation). Views are
zero-copy: numpy.frombuffer(buf, dtype), memoryview(buf), and DLPack
(torch.utils.dlpack.from_dlpack(buf) or buf.dlpack(offset, nbytes, dtype, shape)).
Created by Client.alloc(); freed by Client.free() or Buffer.free().)doc");
  auto* heap_type = reinterpret_cast<PyHeapTypeObject*>(cls.ptr());
  heap_type->as_buffer.bf_getbuffer = &GetBufferSlot;
  heap_type->as_buffer.bf_releasebuffer = &ReleaseBufferSlot;

  cls.def_property_readonly("id", &PyBuffer::id)
      .def_property_readonly("nbytes", &PyBuffer::nbytes)
      .def_property_readonly("name", &PyBuffer::name)
      .def_property_readonly("address", &PyBuffer::address,
                             "Address of the first byte in this process (for range checks).")
      .def_property_readonly("freed", &PyBuffer::freed)
      .def_property_readonly("exports", &PyBuffer::exports, "Number of live zero-copy views.")
      .def("__len__", &PyBuffer::nbytes)
      .def("free", &PyBuffer::Free)
      .def(
          "dlpack",
          [](py::object self, uint64_t offset, int64_t nbytes, const std::string& dtype,
             std::optional<std::vector<int64_t>> shape, py::object keepalive) {
            return Export(std::move(self), offset, nbytes, dtype, std::move(shape),
                          std::move(keepalive));
          },
          py::arg("offset") = 0, py::arg("nbytes") = -1, py::arg("dtype") = "uint8",
          py::arg("shape") = py::none(), py::arg("keepalive") = py::none(),
          "A DLPack capsule viewing [offset, offset + nbytes) as `dtype` with `shape` "
          "(default: 1-D). nbytes=-1 means to the end of the buffer. `keepalive` is "
          "referenced until the consumer releases the view (its finalizer then runs), "
          "which lets a pool learn exactly when memory is free again.")
      .def(
          "__dlpack__",
          [](py::object self, py::object stream, py::object max_version, py::object dl_device,
             py::object copy) {
            if (!copy.is_none() && copy.cast<bool>()) {
              throw py::buffer_error("hsdp Buffer exports zero-copy views only (copy=True)");
            }
            if (!dl_device.is_none()) {
              auto dev = dl_device.cast<std::pair<int, int>>();
              if (dev.first != kDLCPU) {
                throw py::buffer_error("hsdp Buffer lives in host memory (DLPack device 1)");
              }
            }
            (void)stream;
            (void)max_version;  // we produce a DLPack 0.x capsule, which consumers accept
            return Export(std::move(self), 0, -1, "uint8", std::nullopt, py::none());
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const PyBuffer&) { return py::make_tuple(int{kDLCPU}, 0); })
      .def("__repr__", [](const PyBuffer& b) {
        return absl::StrCat("<hsdp Buffer id=", b.id(), " nbytes=", b.nbytes(),
                            b.name().empty() ? "" : " name=", b.name(), b.freed() ? " freed" : "",
                            ">");
      });
}

}  // namespace hsdp::python
