// Internals of reduce_kernels.h exposed for tests and benchmarks: explicit
// choice of the instruction set and of the streaming-store threshold, and the
// scalar number-format conversions the kernels use. Not for engine code.
#ifndef HSDP_KERNELS_REDUCE_KERNELS_INTERNAL_H_
#define HSDP_KERNELS_REDUCE_KERNELS_INTERNAL_H_

#include <cstddef>
#include <cstdint>

#include "hsdp/kernels/reduce_kernels.h"

namespace hsdp::cpu::internal {

// Kernel sets. Every set computes bit-identical results.
enum class Isa : uint8_t {
  kScalar = 0,  // portable C++ (baseline x86-64 / any target)
  kAvx2 = 1,    // AVX2 + F16C intrinsics
};

// The best set this CPU supports; what Reduce() and Cast() use.
Isa BestIsa();

// Reduce writes its outputs with non-temporal (cache-bypassing) stores (AVX2
// set; integers in both sets) when the call touches at least this many bytes,
// count * element size * (n_inputs + n_outputs), and no output aliases an
// input: data that large leaves the cache before anyone reads it again, and
// streaming saves reading every output line before writing it. Measured on a
// 2-core AMD EPYC (Zen 5) VM with float32 sums of 2 inputs into 2 outputs:
// streaming is ~20% slower with 4 MiB buffers (16 MiB touched) and faster
// from 6 MiB buffers (24 MiB touched) up.
inline constexpr size_t kDefaultStreamingStoreMinBytes = size_t{20} << 20;

struct KernelOptions {
  Isa isa = Isa::kScalar;  // must be supported by this CPU (<= BestIsa())
  size_t streaming_store_min_bytes = kDefaultStreamingStoreMinBytes;
};

// Reduce() and Cast() with explicit options.
void ReduceWith(const KernelOptions& options, const ReduceSpec& spec, const void* const* inputs,
                int n_inputs, void* const* outputs, int n_outputs, size_t count);
void CastWith(const KernelOptions& options, DataType from, const void* in, DataType to, void* out,
              size_t count);

// Scalar conversions between IEEE binary16 / bfloat16 bit patterns and
// float/double: round to nearest even, overflow to inf, subnormals kept, NaN
// quieted keeping the sign and top payload bits (bit-identical to F16C).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
uint16_t DoubleToHalf(double d);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);
uint16_t DoubleToBFloat16(double d);

}  // namespace hsdp::cpu::internal

#endif  // HSDP_KERNELS_REDUCE_KERNELS_INTERNAL_H_
