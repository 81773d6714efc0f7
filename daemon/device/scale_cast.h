// The fused scale+cast kernel launcher (scale_cast.cu), kept free of
// abseil and CUDA types so both nvcc and the host compiler include it.
#ifndef HSDP_DAEMON_DEVICE_SCALE_CAST_H_
#define HSDP_DAEMON_DEVICE_SCALE_CAST_H_

#include <cstdint>

namespace hsdp::device {

// dst[i] = (to) ((from) src[i] * scale) for `count` elements on `stream`
// (a cudaStream_t). `from` / `to` are hsdp::DataType values (float types).
// Returns the cudaError_t of the launch (0 on success).
int LaunchScaleCast(const void* src, int from, void* dst, int to, uint64_t count, double scale,
                    void* stream);

}  // namespace hsdp::device

#endif  // HSDP_DAEMON_DEVICE_SCALE_CAST_H_
