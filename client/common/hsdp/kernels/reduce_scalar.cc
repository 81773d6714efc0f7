// The portable ("scalar") floating-point reduction kernels: short loops over
// blocks that the compiler can vectorise for the baseline ISA. Also finish the
// unaligned heads and short tails of the AVX2 kernels.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "hsdp/kernels/kernel_common.h"

namespace hsdp::cpu::internal {
namespace {

// The stages below run over one block held in C; each tests the plan once per
// block, leaving loops simple enough for the compiler to vectorise.

template <typename C>
void ScaleBlock(const Scale<C>& scale, C* x, size_t len) {
  if (scale.mode == ScaleMode::kMul) {
    for (size_t k = 0; k < len; ++k) x[k] *= scale.value;
  } else if (scale.mode == ScaleMode::kDiv) {
    for (size_t k = 0; k < len; ++k) x[k] /= scale.value;
  }
}

template <typename C>
void RoundBlockToWire(Wire wire, C* x, size_t len) {
  switch (wire) {
    case Wire::kNone:
      return;
    case Wire::kFloat32:
      for (size_t k = 0; k < len; ++k) x[k] = static_cast<C>(static_cast<float>(x[k]));
      return;
    case Wire::kFloat16:
      for (size_t k = 0; k < len; ++k) x[k] = RoundToWire(Wire::kFloat16, x[k]);
      return;
    case Wire::kBFloat16:
      for (size_t k = 0; k < len; ++k) x[k] = RoundToWire(Wire::kBFloat16, x[k]);
      return;
  }
}

// x[k] = inputs element k, pre-scaled and rounded to the wire type.
template <DataType kD, typename C>
void LoadBlock(const FloatPlan<C>& plan, const ElemT<kD>* src, C* x, size_t len) {
  for (size_t k = 0; k < len; ++k) x[k] = ToCompute<kD, C>(src[k]);
  ScaleBlock(plan.pre, x, len);
  RoundBlockToWire(plan.wire, x, len);
}

}  // namespace

// Reduces elements [begin, end). Works in blocks: reads every input of a block
// before writing any output, so exact aliasing is safe.
template <DataType kD, typename C, FloatOp kOp>
void ReduceFloatScalar(const FloatPlan<C>& plan, const void* const* inputs, int n_inputs,
                       void* const* outputs, int n_outputs, size_t begin, size_t end) {
  using T = ElemT<kD>;
  constexpr size_t kBlock = 512;
  C acc[kBlock];
  C x[kBlock];
  T encoded[kBlock];
  for (size_t base = begin; base < end; base += kBlock) {
    const size_t len = std::min(kBlock, end - base);
    LoadBlock<kD>(plan, static_cast<const T*>(inputs[0]) + base, acc, len);
    for (int r = 1; r < n_inputs; ++r) {
      LoadBlock<kD>(plan, static_cast<const T*>(inputs[r]) + base, x, len);
      for (size_t k = 0; k < len; ++k) acc[k] = Combine<kOp>(acc[k], x[k]);
    }
    ScaleBlock(plan.post, acc, len);
    RoundBlockToWire(plan.wire, acc, len);
    for (size_t k = 0; k < len; ++k) encoded[k] = FromCompute<kD, C>(acc[k]);
    for (int j = 0; j < n_outputs; ++j) {
      std::memcpy(static_cast<T*>(outputs[j]) + base, encoded, len * sizeof(T));
    }
  }
}

#define HSDP_INSTANTIATE_FOR_OPS(kD, C)                                                          \
  template void ReduceFloatScalar<kD, C, FloatOp::kSum>(const FloatPlan<C>&, const void* const*, \
                                                        int, void* const*, int, size_t, size_t); \
  template void ReduceFloatScalar<kD, C, FloatOp::kProduct>(                                     \
      const FloatPlan<C>&, const void* const*, int, void* const*, int, size_t, size_t);          \
  template void ReduceFloatScalar<kD, C, FloatOp::kMin>(const FloatPlan<C>&, const void* const*, \
                                                        int, void* const*, int, size_t, size_t); \
  template void ReduceFloatScalar<kD, C, FloatOp::kMax>(const FloatPlan<C>&, const void* const*, \
                                                        int, void* const*, int, size_t, size_t);
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat32, float)
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat16, float)
HSDP_INSTANTIATE_FOR_OPS(DataType::kBFloat16, float)
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat32, double)
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat16, double)
HSDP_INSTANTIATE_FOR_OPS(DataType::kBFloat16, double)
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat64, double)
#undef HSDP_INSTANTIATE_FOR_OPS

}  // namespace hsdp::cpu::internal
