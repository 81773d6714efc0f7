// Element-wise kernels for the CPU engine: reduction of N inputs into M
// outputs in one pass, and dtype casts. Vectorised (AVX2/F16C when the CPU has
// them, chosen at run time; a portable scalar path otherwise); single-threaded
// (the caller splits work across threads by element ranges). Stateless and
// thread-safe.
#ifndef HSDP_KERNELS_REDUCE_KERNELS_H_
#define HSDP_KERNELS_REDUCE_KERNELS_H_

#include <cstddef>

#include "hsdp/kernels/reduce_spec.h"
#include "hsdp/types.h"

namespace hsdp::cpu {

// Fully validated parameters (the caller checked every combination).
using ReduceSpec = ::hsdp::ReduceSpec;  // daemon/kernels/reduce_spec.h

// For every i in [0, count):
//   x_r = inputs[r][i] converted to the compute type C, then
//         * s with s = premul_factor / pre_divide  for kPremulSum,
//         / pre_divide                              for every other op,
//         then rounded to wire_dtype when one is set;
//   y   = op(x_0, ..., x_{n-1}) evaluated in C, strictly left to right
//         (((x_0 op x_1) op x_2) ...), so the result does not depend on the caller;
//   y  /= d with d = post_divide (times n_inputs for kAvg);
//   y is rounded to wire_dtype when one is set, then to dtype;
//   outputs[j][i] = y for every j.
//
// Floating point:
//   * C is float64 when dtype or wire_dtype is float64, float32 otherwise (so
//     16-bit floats accumulate in float32). s, pre_divide and d are rounded to C.
//     A divisor that is a power of two is applied as a multiplication by its
//     exact reciprocal (bit-identical to the division); a divisor or s equal to
//     1 is not applied at all.
//   * Every rounding is to nearest, ties to even; overflow gives +-inf;
//     subnormals are kept, never flushed to zero (the calling thread must keep
//     the default MXCSR: round to nearest, no FTZ/DAZ). NaNs stay NaN:
//     conversions to a narrower float keep the sign and the top payload bits
//     and set the quiet bit (what F16C does). Which payload survives when NaNs
//     meet is unspecified.
//   * kMin/kMax: if any x_r is NaN the result is NaN (like torch); otherwise
//     x_r replaces the running value only when strictly smaller/greater, so
//     among equal values (-0 vs +0) the earlier input wins.
//   * wire_dtype equal to dtype, or float32 with a 16-bit dtype, changes nothing.
// Integers (int32, int64, uint8): arithmetic wraps modulo 2^bits in the type
//   itself (kSum, kAvg, kPremulSum, kProduct); kMin/kMax compare as the type
//   (int32/int64 signed, uint8 unsigned). kAvg divides the wrapped sum by
//   n_inputs truncating toward zero. kPremulSum multiplies each input by
//   premul_factor truncated toward zero (wrapping). pre/post divide must be 1;
//   wire_dtype is ignored.
// Inputs and outputs may alias each other exactly (in-place: outputs[j] ==
// inputs[r] for any j, r), never partially. Large calls whose outputs alias no
// input write the outputs with non-temporal (cache-bypassing) stores.
// n_inputs >= 1; n_outputs >= 0; buffers need only element alignment.
void Reduce(const ReduceSpec& spec, const void* const* inputs, int n_inputs, void* const* outputs,
            int n_outputs, size_t count);

// Converts `count` elements from `from` to `to`:
//   float -> float: round to nearest even (one rounding), overflow to +-inf,
//                   NaN kept as a quiet NaN (as in Reduce);
//   int   -> float: round to nearest even, one rounding (also int64 -> bfloat16);
//   float -> int:   truncation toward zero, saturating at the type's limits,
//                   NaN -> 0;
//   int   -> int:   two's complement wrap (int64 -> int32 keeps the low 32 bits,
//                   int32 -> uint8 the low 8, uint8 zero-extends).
// `in` and `out` must not overlap, except that they may be the same pointer
// when the two types have the same size.
void Cast(DataType from, const void* in, DataType to, void* out, size_t count);

}  // namespace hsdp::cpu

#endif  // HSDP_KERNELS_REDUCE_KERNELS_H_
