// How a reducing task combines its inputs; engine-neutral (the CPU kernels,
// and later device kernels, implement it).
#ifndef HSDP_KERNELS_REDUCE_SPEC_H_
#define HSDP_KERNELS_REDUCE_SPEC_H_

#include "hsdp/types.h"

namespace hsdp {

struct ReduceSpec {
  DataType dtype = DataType::kFloat32;  // of inputs and outputs
  ReduceOp op = ReduceOp::kSum;
  DataType wire_dtype = DataType::kInvalid;  // kInvalid = dtype; else a float type
  double premul_factor = 1.0;                // kPremulSum only
  double pre_divide = 1.0;                   // > 0
  double post_divide = 1.0;                  // > 0; kAvg multiplies this by n_inputs
};

}  // namespace hsdp

#endif  // HSDP_KERNELS_REDUCE_SPEC_H_
