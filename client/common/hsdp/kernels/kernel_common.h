// What the files of the CPU kernels share: element types and their
// conversions to the compute type, reduction plans, the streaming-store
// decision, the AVX2 target attributes, and the declarations of the kernel
// sets each file implements (reduce_scalar.cc, reduce_avx2.cc, reduce_int.cc,
// cast.cc). Internal to the CPU kernels.
//
// Both kernel sets perform exactly the same IEEE operations in the same order,
// so they produce bit-identical results; the AVX2 kernels hand their unaligned
// head and short tail to the scalar kernels. No fused multiply-add is ever
// enabled (it would change roundings).
#ifndef HSDP_KERNELS_KERNEL_COMMON_H_
#define HSDP_KERNELS_KERNEL_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hsdp/kernels/float16_convert.h"
#include "hsdp/kernels/reduce_kernels.h"
#include "hsdp/kernels/reduce_kernels_internal.h"

// Functions compiled for AVX2 + F16C. They may only run after BestIsa() said
// kAvx2. Every declaration and the definition must carry the same attribute
// (differing target attributes would make GCC treat them as versions).
#define HSDP_AVX2 __attribute__((target("avx2,f16c")))
#define HSDP_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace hsdp::cpu::internal {

// ---------------------------------------------------------------------------
// Element types.

template <DataType kD>
struct Elem;
template <>
struct Elem<DataType::kFloat32> {
  using T = float;
};
template <>
struct Elem<DataType::kFloat16> {
  using T = uint16_t;
};
template <>
struct Elem<DataType::kBFloat16> {
  using T = uint16_t;
};
template <>
struct Elem<DataType::kFloat64> {
  using T = double;
};
template <>
struct Elem<DataType::kInt32> {
  using T = int32_t;
};
template <>
struct Elem<DataType::kInt64> {
  using T = int64_t;
};
template <>
struct Elem<DataType::kUInt8> {
  using T = uint8_t;
};
template <DataType kD>
using ElemT = typename Elem<kD>::T;

// Value of a floating-point element in C (float or double). Exact, except
// float64 -> float, which is never asked for.
template <DataType kD, typename C>
C ToCompute(ElemT<kD> v) {
  if constexpr (kD == DataType::kFloat16) {
    return HalfToFloatInline(v);
  } else if constexpr (kD == DataType::kBFloat16) {
    return BFloat16ToFloatInline(v);
  } else {
    static_assert(std::is_same_v<C, double> || kD != DataType::kFloat64);
    return static_cast<C>(v);
  }
}

// A C value rounded (once) to the element type kD.
template <DataType kD, typename C>
ElemT<kD> FromCompute(C v) {
  if constexpr (kD == DataType::kFloat16) {
    if constexpr (std::is_same_v<C, float>)
      return static_cast<uint16_t>(EncodeFromFloat<5, 10>(v));
    else
      return static_cast<uint16_t>(EncodeFromDouble<5, 10>(v));
  } else if constexpr (kD == DataType::kBFloat16) {
    if constexpr (std::is_same_v<C, float>)
      return FloatToBFloat16Inline(v);
    else
      return static_cast<uint16_t>(EncodeFromDouble<8, 7>(v));
  } else {
    return static_cast<ElemT<kD>>(v);
  }
}

// ---------------------------------------------------------------------------
// Reduction plans.

enum class FloatOp : uint8_t { kSum, kProduct, kMin, kMax };
enum class ScaleMode : uint8_t { kNone, kMul, kDiv };
// Rounding to the wire type; float32 only matters when computing in double.
enum class Wire : uint8_t { kNone, kFloat32, kFloat16, kBFloat16 };

template <typename C>
struct Scale {
  ScaleMode mode = ScaleMode::kNone;
  C value = 1;
};

template <typename C>
struct FloatPlan {
  Scale<C> pre;   // applied to every input
  Scale<C> post;  // applied to the reduced value
  Wire wire = Wire::kNone;
};

template <typename C>
C RoundToWire(Wire wire, C x) {
  switch (wire) {
    case Wire::kNone:
      return x;
    case Wire::kFloat32:
      return static_cast<C>(static_cast<float>(x));
    case Wire::kFloat16:
      return HalfToFloatInline(FromCompute<DataType::kFloat16, C>(x));
    case Wire::kBFloat16:
      return BFloat16ToFloatInline(FromCompute<DataType::kBFloat16, C>(x));
  }
  return x;
}

template <FloatOp kOp, typename C>
C Combine(C acc, C x) {
  if constexpr (kOp == FloatOp::kSum) return acc + x;
  if constexpr (kOp == FloatOp::kProduct) return acc * x;
  // NaN in x wins; NaN in acc stays because comparisons with it are false.
  if constexpr (kOp == FloatOp::kMax) return (x != x || x > acc) ? x : acc;
  if constexpr (kOp == FloatOp::kMin) return (x != x || x < acc) ? x : acc;
}

// ---------------------------------------------------------------------------
// Streaming stores.

inline constexpr size_t kNoStreaming = std::numeric_limits<size_t>::max();
inline constexpr uintptr_t kStreamAlignment = 32;

// Whether to write with non-temporal stores, and if so how many leading
// elements to leave to regular stores so that every output is 32-byte aligned
// for the rest. kNoStreaming when not streaming.
inline size_t StreamingHead(size_t min_bytes, size_t elem_size, const void* const* inputs,
                            int n_inputs, void* const* outputs, int n_outputs, size_t count) {
  const size_t touched = count * elem_size * static_cast<size_t>(n_inputs + n_outputs);
  if (touched < min_bytes) return kNoStreaming;
  for (int j = 0; j < n_outputs; ++j) {
    for (int r = 0; r < n_inputs; ++r) {
      if (outputs[j] == inputs[r]) return kNoStreaming;
    }
  }
  const uintptr_t phase = reinterpret_cast<uintptr_t>(outputs[0]) % kStreamAlignment;
  if (phase % elem_size != 0) return kNoStreaming;
  for (int j = 1; j < n_outputs; ++j) {
    if (reinterpret_cast<uintptr_t>(outputs[j]) % kStreamAlignment != phase) return kNoStreaming;
  }
  const size_t head = (kStreamAlignment - phase) % kStreamAlignment / elem_size;
  return head < count ? head : kNoStreaming;
}

// ---------------------------------------------------------------------------
// Kernel sets.

// Scalar floating-point reduction of elements [begin, end) (reduce_scalar.cc;
// instantiated for every dtype with its compute types and every FloatOp).
template <DataType kD, typename C, FloatOp kOp>
void ReduceFloatScalar(const FloatPlan<C>& plan, const void* const* inputs, int n_inputs,
                       void* const* outputs, int n_outputs, size_t begin, size_t end);

// AVX2 floating-point reduction of a whole call (reduce_avx2.cc; instantiated
// for float32, float16 and bfloat16 with C = float and float64 with C = double,
// every FloatOp). Double lanes never have a wire type.
template <DataType kD, typename C, FloatOp kOp>
HSDP_AVX2 void RunFloatAvx2(const KernelOptions& options, const FloatPlan<C>& plan,
                            const void* const* inputs, int n_inputs, void* const* outputs,
                            int n_outputs, size_t count);

// Integer reductions (reduce_int.cc), one per kernel set.
void ReduceIntScalar(const KernelOptions& options, const ReduceSpec& spec,
                     const void* const* inputs, int n_inputs, void* const* outputs, int n_outputs,
                     size_t count);
HSDP_AVX2 void ReduceIntAvx2(const KernelOptions& options, const ReduceSpec& spec,
                             const void* const* inputs, int n_inputs, void* const* outputs,
                             int n_outputs, size_t count);

// Casts (cast.cc). CastScalar converts every element; CastAvx2 converts a
// prefix (float32/float16/bfloat16 only) and returns its length.
void CastScalar(DataType from, const void* in, DataType to, void* out, size_t count);
HSDP_AVX2 size_t CastAvx2(DataType from, const void* in, DataType to, void* out, size_t count);

}  // namespace hsdp::cpu::internal

#endif  // HSDP_KERNELS_KERNEL_COMMON_H_
