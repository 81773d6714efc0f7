// The one element-wise kernel the NCCL engine needs: dst[i] = (To)(src[i] * scale),
// fusing the pre-divide with the cast to the reduce dtype before a
// collective, and the post-divide with the cast back after it. Computes in
// float (double when either side is float64). Grid-stride loop; in place
// when src == dst and the types have the same size.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "daemon/device/scale_cast.h"
#include "hsdp/types.h"

namespace hsdp::device {
namespace {

template <typename T> struct Conv;
template <> struct Conv<float> {
  __device__ static float To(float v) { return v; }
  __device__ static float From(float v) { return v; }
};
template <> struct Conv<double> {
  __device__ static double To(double v) { return v; }
  __device__ static double From(double v) { return v; }
};
template <> struct Conv<__half> {
  __device__ static float To(__half v) { return __half2float(v); }
  __device__ static __half From(float v) { return __float2half_rn(v); }
};
template <> struct Conv<__nv_bfloat16> {
  __device__ static float To(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 From(float v) { return __float2bfloat16_rn(v); }
};

template <typename In, typename Out, typename C>
__global__ void ScaleCastKernel(const In* src, Out* dst, uint64_t n, C scale,
                                bool scaled) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    C v = static_cast<C>(Conv<In>::To(src[i]));
    if (scaled) v *= scale;
    dst[i] = Conv<Out>::From(v);
  }
}

template <typename In, typename Out>
cudaError_t Launch(const void* src, void* dst, uint64_t n, double scale, cudaStream_t s) {
  constexpr bool kWide = sizeof(In) == 8 || sizeof(Out) == 8;
  using C = typename std::conditional<kWide, double, float>::type;
  const int threads = 256;
  const uint64_t blocks64 = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(blocks64 < 4096 ? blocks64 : 4096);
  ScaleCastKernel<In, Out, C><<<blocks, threads, 0, s>>>(static_cast<const In*>(src),
                                                         static_cast<Out*>(dst), n,
                                                         static_cast<C>(scale), scale != 1.0);
  return cudaGetLastError();
}

template <typename In>
cudaError_t LaunchTo(DataType to, const void* src, void* dst, uint64_t n, double scale,
                     cudaStream_t s) {
  switch (to) {
    case DataType::kFloat32: return Launch<In, float>(src, dst, n, scale, s);
    case DataType::kFloat64: return Launch<In, double>(src, dst, n, scale, s);
    case DataType::kFloat16: return Launch<In, __half>(src, dst, n, scale, s);
    case DataType::kBFloat16: return Launch<In, __nv_bfloat16>(src, dst, n, scale, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int LaunchScaleCast(const void* src, int from, void* dst, int to, uint64_t count, double scale,
                    void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const auto t = static_cast<DataType>(to);
  switch (static_cast<DataType>(from)) {
    case DataType::kFloat32: return LaunchTo<float>(t, src, dst, count, scale, s);
    case DataType::kFloat64: return LaunchTo<double>(t, src, dst, count, scale, s);
    case DataType::kFloat16: return LaunchTo<__half>(t, src, dst, count, scale, s);
    case DataType::kBFloat16: return LaunchTo<__nv_bfloat16>(t, src, dst, count, scale, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace hsdp::device
