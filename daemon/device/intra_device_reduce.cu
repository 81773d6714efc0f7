// The intra-device reduction (see intra_device_reduce.h): one grid-stride
// pass reading up to kMaxReduceInputs member buffers on the same GPU, scaling
// each (the pre-divide or PreMulSum factor), combining them with the op and
// an optional running value in dst, and writing dst in the output type.
// Computes in float (double when float64 is involved); integers in their own
// type (wrapping, as the CPU kernels). NaN propagates through min/max.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "daemon/device/intra_device_reduce.h"
#include "hsdp/types.h"

namespace hsdp::device {
namespace {

template <typename T> struct Conv {
  using C = T;
  __device__ static C To(T v) { return v; }
  __device__ static T From(C v) { return v; }
};
template <> struct Conv<__half> {
  using C = float;
  __device__ static float To(__half v) { return __half2float(v); }
  __device__ static __half From(float v) { return __float2half_rn(v); }
};
template <> struct Conv<__nv_bfloat16> {
  using C = float;
  __device__ static float To(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 From(float v) { return __float2bfloat16_rn(v); }
};

struct Inputs {
  const void* p[kMaxReduceInputs];
};
struct Outputs {
  void* p[kMaxReduceInputs];
};

template <typename C>
__device__ C Combine(C a, C b, int op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin:
      if constexpr (std::is_floating_point<C>::value) {
        if (a != a || b != b) return a != a ? a : b;
      }
      return b < a ? b : a;
    default:
      if constexpr (std::is_floating_point<C>::value) {
        if (a != a || b != b) return a != a ? a : b;
      }
      return b > a ? b : a;
  }
}

// Each thread reads element i of every input before it writes element i of
// any output, so an output may be one of the inputs (in place).
template <typename In, typename Out, typename C>
__global__ void ReduceKernel(Inputs in, int n, Outputs out, int nout, uint64_t count, int op,
                             C scale, bool scaled, C out_scale, bool out_scaled, bool accumulate) {
  Out* dst = static_cast<Out*>(out.p[0]);
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < count;
       i += uint64_t(gridDim.x) * blockDim.x) {
    C acc{};
    int k = 0;
    if (accumulate) {
      acc = static_cast<C>(Conv<Out>::To(dst[i]));
    } else {
      acc = static_cast<C>(Conv<In>::To(static_cast<const In*>(in.p[0])[i]));
      if (scaled) acc *= scale;
      k = 1;
    }
    for (; k < n; ++k) {
      C v = static_cast<C>(Conv<In>::To(static_cast<const In*>(in.p[k])[i]));
      if (scaled) v *= scale;
      acc = Combine<C>(acc, v, op);
    }
    if (out_scaled) acc *= out_scale;
    const Out r = Conv<Out>::From(static_cast<typename Conv<Out>::C>(acc));
    for (int j = 0; j < nout; ++j) static_cast<Out*>(out.p[j])[i] = r;
  }
}

template <typename In, typename Out>
cudaError_t Launch(const Inputs& in, int n, const Outputs& out, int nout, uint64_t count, int op,
                   double scale, double out_scale, bool accumulate, cudaStream_t s) {
  constexpr bool kInt = std::is_integral<In>::value;
  constexpr bool kWide = sizeof(In) == 8 || sizeof(Out) == 8;
  using C = typename std::conditional<kInt, In,
                                      typename std::conditional<kWide, double, float>::type>::type;
  const int threads = 256;
  const uint64_t blocks64 = (count + threads - 1) / threads;
  const int blocks = static_cast<int>(blocks64 < 4096 ? blocks64 : 4096);
  ReduceKernel<In, Out, C><<<blocks, threads, 0, s>>>(
      in, n, out, nout, count, op, static_cast<C>(scale), scale != 1.0,
      static_cast<C>(out_scale), out_scale != 1.0, accumulate);
  return cudaGetLastError();
}

struct Args {
  Inputs in;
  int n;
  Outputs out;
  int nout;
  uint64_t count;
  int op;
  double scale, out_scale;
  bool accumulate;
  cudaStream_t s;
};

template <typename In, typename Out>
cudaError_t Launch(const Args& a) {
  return Launch<In, Out>(a.in, a.n, a.out, a.nout, a.count, a.op, a.scale, a.out_scale,
                         a.accumulate, a.s);
}

template <typename In>
cudaError_t LaunchFloatTo(DataType to, const Args& a) {
  switch (to) {
    case DataType::kFloat32: return Launch<In, float>(a);
    case DataType::kFloat64: return Launch<In, double>(a);
    case DataType::kFloat16: return Launch<In, __half>(a);
    case DataType::kBFloat16: return Launch<In, __nv_bfloat16>(a);
    default: return cudaErrorInvalidValue;
  }
}

int LaunchAny(int from, int to, const Args& a) {
  if (a.count == 0) return cudaSuccess;
  const auto f = static_cast<DataType>(from), t = static_cast<DataType>(to);
  switch (f) {
    case DataType::kFloat32: return LaunchFloatTo<float>(t, a);
    case DataType::kFloat64: return LaunchFloatTo<double>(t, a);
    case DataType::kFloat16: return LaunchFloatTo<__half>(t, a);
    case DataType::kBFloat16: return LaunchFloatTo<__nv_bfloat16>(t, a);
    default: break;
  }
  if (f != t || a.scale != 1.0 || a.out_scale != 1.0) return cudaErrorInvalidValue;
  switch (f) {
    case DataType::kInt32: return Launch<int32_t, int32_t>(a);
    case DataType::kInt64: return Launch<int64_t, int64_t>(a);
    case DataType::kUInt8: return Launch<uint8_t, uint8_t>(a);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int LaunchIntraDeviceReduce(const void* const* srcs, int n, int from, void* dst, int to,
                            uint64_t count, int op, double scale, bool accumulate, void* stream) {
  if (n < 1 || n > kMaxReduceInputs) return cudaErrorInvalidValue;
  Args a{};
  for (int k = 0; k < n; ++k) a.in.p[k] = srcs[k];
  a.n = n;
  a.out.p[0] = dst;
  a.nout = 1;
  a.count = count;
  a.op = op;
  a.scale = scale;
  a.out_scale = 1.0;
  a.accumulate = accumulate;
  a.s = static_cast<cudaStream_t>(stream);
  return LaunchAny(from, to, a);
}

int LaunchIntraDeviceReduceMany(const void* const* srcs, int n, int from, void* const* dsts,
                                int ndst, int to, uint64_t count, int op, double in_scale,
                                double out_scale, void* stream) {
  if (n < 1 || n > kMaxReduceInputs || ndst < 1 || ndst > kMaxReduceInputs) {
    return cudaErrorInvalidValue;
  }
  Args a{};
  for (int k = 0; k < n; ++k) a.in.p[k] = srcs[k];
  for (int j = 0; j < ndst; ++j) a.out.p[j] = dsts[j];
  a.n = n;
  a.nout = ndst;
  a.count = count;
  a.op = op;
  a.scale = in_scale;
  a.out_scale = out_scale;
  a.accumulate = false;
  a.s = static_cast<cudaStream_t>(stream);
  return LaunchAny(from, to, a);
}

}  // namespace hsdp::device
