// The intra-device reduction kernel launcher (intra_device_reduce.cu): the
// members of a collective that share one GPU are reduced there by hsdpd's own
// kernel (NCCL refuses two ranks of a communicator on one device). Kept free
// of abseil and CUDA types so both nvcc and the host compiler include it.
#ifndef HSDP_DAEMON_DEVICE_INTRA_DEVICE_REDUCE_H_
#define HSDP_DAEMON_DEVICE_INTRA_DEVICE_REDUCE_H_

#include <cstdint>

namespace hsdp::device {

// Inputs one launch takes; more are folded in by further launches that
// accumulate into dst.
inline constexpr int kMaxReduceInputs = 8;

// dst[i] = (to) op(acc, op_k ((from) srcs[k][i] * scale)) over `n` <=
// kMaxReduceInputs inputs, acc = dst[i] when `accumulate`. `from` / `to` are
// hsdp::DataType values, `op` a hsdp::ReduceOp (sum, min, max, product);
// integer types need from == to and scale 1. `stream` is a cudaStream_t.
// Returns the cudaError_t of the launch (0 on success).
int LaunchIntraDeviceReduce(const void* const* srcs, int n, int from, void* dst, int to,
                            uint64_t count, int op, double scale, bool accumulate, void* stream);

// dsts[j][i] = (to) (op_k ((from) srcs[k][i] * in_scale) * out_scale) for
// every j < ndst <= kMaxReduceInputs, one pass; a dst may be one of the srcs
// (exactly, same element size). Integer types need in and out scale 1.
int LaunchIntraDeviceReduceMany(const void* const* srcs, int n, int from, void* const* dsts,
                                int ndst, int to, uint64_t count, int op, double in_scale,
                                double out_scale, void* stream);

}  // namespace hsdp::device

#endif  // HSDP_DAEMON_DEVICE_INTRA_DEVICE_REDUCE_H_
