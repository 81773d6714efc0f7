// Element-wise kernels for the CPU engine: reduction of N inputs into M
// outputs in one pass, and dtype casts. Vectorised; single-threaded (the
// caller splits work across threads by element ranges).
#ifndef HSDP_DAEMON_ENGINE_CPU_REDUCE_KERNELS_H_
#define HSDP_DAEMON_ENGINE_CPU_REDUCE_KERNELS_H_

#include <cstddef>

#include "hsdp/types.h"

namespace hsdp::cpu {

// Fully validated parameters (the caller checked every combination).
struct ReduceSpec {
  DataType dtype = DataType::kFloat32;        // of inputs and outputs
  ReduceOp op = ReduceOp::kSum;
  DataType wire_dtype = DataType::kInvalid;   // kInvalid = dtype; else a float type
  double premul_factor = 1.0;                 // kPremulSum only
  double pre_divide = 1.0;                    // > 0
  double post_divide = 1.0;                   // > 0; kAvg multiplies this by n_inputs
};

// For every i in [0, count):
//   x_r = inputs[r][i] / pre_divide (* premul_factor for kPremulSum), rounded
//         to wire_dtype when one is set;
//   y   = op(x_0, ..., x_{n-1}) accumulated in float32 for 16-bit floats and float32, float64 for
//         float64, and in the integer type for integers (wrapping);
//   y  /= post_divide (and / n_inputs for kAvg); rounded to wire_dtype, then to dtype;
//   outputs[j][i] = y for every j.
// Integers: pre/post divide must be 1; kAvg divides with truncation toward zero.
// Inputs and outputs may alias each other exactly (in-place), never partially.
void Reduce(const ReduceSpec& spec, const void* const* inputs, int n_inputs,
            void* const* outputs, int n_outputs, size_t count);

// Converts `count` elements from `from` to `to` (round-to-nearest-even).
void Cast(DataType from, const void* in, DataType to, void* out, size_t count);

}  // namespace hsdp::cpu

#endif  // HSDP_DAEMON_ENGINE_CPU_REDUCE_KERNELS_H_
