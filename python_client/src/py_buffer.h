// hsdp._hsdp.Buffer: a shared host buffer registered with hsdpd, exposed
// zero-copy through the Python buffer protocol (numpy.frombuffer, memoryview)
// and DLPack (torch.utils.dlpack.from_dlpack, numpy.from_dlpack).
//
// Lifetime: a Buffer keeps its Client's mapping alive; every exported view
// (memoryview, ndarray, tensor) keeps the Buffer alive. free() refuses while
// views exist, so a view can never outlive its memory. All methods need the
// GIL (the export count is guarded by it).
#ifndef HSDP_PYTHON_PY_BUFFER_H_
#define HSDP_PYTHON_PY_BUFFER_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hsdp/client.h"

namespace hsdp::python {

class PyBuffer {
 public:
  PyBuffer(std::shared_ptr<Client> client, Buffer buffer, std::string name)
      : client_(std::move(client)), buffer_(buffer), name_(std::move(name)) {}

  uint64_t id() const { return buffer_.id; }
  size_t nbytes() const { return buffer_.size; }
  const std::string& name() const { return name_; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(buffer_.data); }
  bool freed() const { return freed_; }
  int exports() const { return exports_; }
  const std::shared_ptr<Client>& client() const { return client_; }

  // Throws FailedPrecondition once freed.
  void CheckUsable() const;
  // A pointer to [offset, offset + nbytes); throws OutOfRange outside the buffer.
  void* Range(uint64_t offset, uint64_t nbytes) const;
  // Unregisters and unmaps (GIL released around the RPC). Throws
  // FailedPrecondition while views are exported; a second call is a no-op.
  void Free();

  void AddExport() { ++exports_; }
  void RemoveExport() { --exports_; }

 private:
  std::shared_ptr<Client> client_;
  Buffer buffer_;
  std::string name_;
  bool freed_ = false;
  int exports_ = 0;
};

// Binds the class (with buffer protocol and __dlpack__) into `m`.
void BindBuffer(pybind11::module_& m);

}  // namespace hsdp::python

#endif  // HSDP_PYTHON_PY_BUFFER_H_
