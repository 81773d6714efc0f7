// A minimal, ABI-compatible definition of the DLPack 0.x structs (as in
// dlpack.h v0.8, the "dltensor" capsule protocol) and a producer of capsules
// over shared hsdpd memory.
#ifndef HSDP_PYTHON_DLPACK_H_
#define HSDP_PYTHON_DLPACK_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace hsdp::python {

// --- DLPack 0.x ABI (field order and widths are the contract) ---------------
enum DLDeviceType : int32_t { kDLCPU = 1 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // nullptr: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(sizeof(DLTensor) == 48 && sizeof(DLManagedTensor) == 64);

// Returns the DLPack dtype for an hsdp dtype name ("float32", "bf16", ...,
// plus "int8", "int16", "bool" which only views memory). Throws
// InvalidArgument for unknown names.
DLDataType DlpackDataType(const std::string& name);

// Makes a "dltensor" capsule viewing `data` (CPU memory) with `shape` and
// `dtype`. `owner` is kept alive until the consumer releases the tensor;
// `on_release` (may be empty) runs then, with the GIL held. The capsule's
// destructor releases it if it was never consumed.
pybind11::capsule MakeDlpackCapsule(void* data, const std::vector<int64_t>& shape, DLDataType dtype,
                                    pybind11::object owner, std::function<void()> on_release);

}  // namespace hsdp::python

#endif  // HSDP_PYTHON_DLPACK_H_
