// A reduction split into stages, for engines that reduce part of the inputs
// in one place and the rest elsewhere (the cross-node engine: this node's
// members first, then the nodes' partial results). The stages together
// compute what Reduce() (reduce_kernels.h) computes over all inputs, up to
// the order of the combining operations:
//
//   ReducePartial  x_r converted to the compute type C, pre-scaled and rounded
//                  to the wire type exactly as Reduce does, combined in C; the
//                  result stays in C (no post-division, no final rounding);
//   CombinePartials  partials (in C) combined in C;
//   FinishPartials   partials combined in C, then divided by post_divide
//                  (times `total_inputs` for kAvg), rounded to the wire type
//                  and to dtype, written to every output.
//
// C is PartialType(spec): float64 when dtype or wire_dtype is float64,
// float32 for the other floating-point types, the integer type itself for
// integers. Integer results are exact (wrapping arithmetic is associative);
// min/max are exact except which of -0/+0 wins a tie; float sums and products
// differ from the single-pass result only by reassociation. Uses the
// vectorised kernels; 16-bit types and wire rounding go through small blocks
// in C. Stateless and thread-safe; single-threaded.
#ifndef HSDP_DAEMON_ENGINE_CPU_PARTIAL_REDUCE_H_
#define HSDP_DAEMON_ENGINE_CPU_PARTIAL_REDUCE_H_

#include <cstddef>

#include "hsdp/kernels/reduce_spec.h"
#include "hsdp/types.h"

namespace hsdp::cpu {

// The element type partial results are kept in.
DataType PartialType(const ReduceSpec& spec);

// Whether ReducePartial of a single input is that input, bit for bit (the
// caller may then use the input in place of a partial).
bool PartialIsIdentity(const ReduceSpec& spec);

// partial[i] = op over r of x_r (see above), in PartialType(spec). `partial`
// must not alias an input unless PartialIsIdentity(spec) and n_inputs == 1.
void ReducePartial(const ReduceSpec& spec, const void* const* inputs, int n_inputs, void* partial,
                   size_t count);

// out[i] = op over r of partials[r][i], in PartialType(spec). `out` may be
// one of the partials (exactly).
void CombinePartials(const ReduceSpec& spec, const void* const* partials, int n_partials, void* out,
                     size_t count);

// outputs[j][i] = final(op over r of partials[r][i]) in spec.dtype, where
// final divides by post_divide (times total_inputs for kAvg; integers:
// truncating) and rounds to the wire type, then to dtype. `total_inputs` is
// the number of inputs of the whole reduction (the group size). Outputs may
// alias a partial exactly only when PartialType(spec) == spec.dtype.
void FinishPartials(const ReduceSpec& spec, int total_inputs, const void* const* partials,
                    int n_partials, void* const* outputs, int n_outputs, size_t count);

}  // namespace hsdp::cpu

#endif  // HSDP_DAEMON_ENGINE_CPU_PARTIAL_REDUCE_H_
