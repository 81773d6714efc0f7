// The AVX2 + F16C floating-point reduction kernels (float32, float16,
// bfloat16, float64). Compiled with the AVX2 target attribute for these
// functions only; the dispatcher calls them only when BestIsa() is kAvx2.
#include <immintrin.h>

#include <cstddef>
#include <type_traits>

#include "hsdp/kernels/avx2_vectors.h"
#include "hsdp/kernels/kernel_common.h"

namespace hsdp::cpu::internal {
namespace {

// The per-step transforms below test the plan once per step (not per vector).
template <typename Vec, size_t kN>
HSDP_AVX2_INLINE void ScaleStep(ScaleMode mode, typename Vec::V factor, typename Vec::V (&x)[kN]) {
  if (mode == ScaleMode::kMul) {
#pragma GCC unroll 8
    for (size_t u = 0; u < kN; ++u) x[u] = Vec::Mul(x[u], factor);
  } else if (mode == ScaleMode::kDiv) {
#pragma GCC unroll 8
    for (size_t u = 0; u < kN; ++u) x[u] = Vec::Div(x[u], factor);
  }
}

// Wire rounding in float32 lanes (double lanes never have a wire type here).
template <size_t kN>
HSDP_AVX2_INLINE void WireStep(Wire wire, __m256 (&x)[kN]) {
  if (wire == Wire::kFloat16) {
#pragma GCC unroll 8
    for (size_t u = 0; u < kN; ++u) x[u] = _mm256_cvtph_ps(_mm256_cvtps_ph(x[u], kHalfRounding));
  } else if (wire == Wire::kBFloat16) {
#pragma GCC unroll 8
    for (size_t u = 0; u < kN; ++u) {
      x[u] = RoundToBFloat16(x[u]);
    }
  }
}
template <size_t kN>
HSDP_AVX2_INLINE void WireStep(Wire, __m256d (&)[kN]) {}

template <typename Vec, FloatOp kOp>
HSDP_AVX2_INLINE typename Vec::V CombineV(typename Vec::V acc, typename Vec::V x) {
  if constexpr (kOp == FloatOp::kSum) return Vec::Add(acc, x);
  if constexpr (kOp == FloatOp::kProduct) return Vec::Mul(acc, x);
  if constexpr (kOp == FloatOp::kMax) return Vec::Select(Vec::IsNan(x), x, Vec::Max(x, acc));
  if constexpr (kOp == FloatOp::kMin) return Vec::Select(Vec::IsNan(x), x, Vec::Min(x, acc));
}

// Loads one step of an input and applies the pre scale and wire rounding.
template <DataType kD, bool kPlainInputs, size_t kN>
HSDP_AVX2_INLINE void LoadStep(const FloatPlan<typename Avx2Io<kD>::Vec::C>& plan,
                               typename Avx2Io<kD>::Vec::V pre, const ElemT<kD>* src,
                               typename Avx2Io<kD>::Vec::V (&x)[kN]) {
  using Vec = typename Avx2Io<kD>::Vec;
  static_assert(kN % 2 == 0);
#pragma GCC unroll 8
  for (size_t p = 0; p < kN / 2; ++p) {
    Avx2Io<kD>::Load2(src + p * Avx2Io<kD>::kPairElems, x[2 * p], x[2 * p + 1]);
  }
  if constexpr (!kPlainInputs) {
    ScaleStep<Vec>(plan.pre.mode, pre, x);
    WireStep(plan.wire, x);
  }
}

// Reduces whole steps of kUnroll vectors from `begin` on; returns where it
// stopped (fewer than one step left). Every input of a step is loaded before
// any output of it is stored. kPlainInputs: the plan has no pre scale and no
// wire type (the common case, compiled without those checks).
template <DataType kD, FloatOp kOp, bool kStream, bool kPlainInputs>
HSDP_AVX2 size_t ReduceFloatAvx2Steps(const FloatPlan<typename Avx2Io<kD>::Vec::C>& plan,
                                      const void* const* inputs, int n_inputs, void* const* outputs,
                                      int n_outputs, size_t begin, size_t end) {
  using Io = Avx2Io<kD>;
  using Vec = typename Io::Vec;
  using V = typename Vec::V;
  using T = ElemT<kD>;
  constexpr size_t kPairs = 2;
  constexpr size_t kStep = kPairs * Io::kPairElems;
  const V pre = Vec::Set1(plan.pre.value);
  const V post = Vec::Set1(plan.post.value);
  size_t i = begin;
  for (; end - i >= kStep; i += kStep) {
    V acc[2 * kPairs];
    LoadStep<kD, kPlainInputs>(plan, pre, static_cast<const T*>(inputs[0]) + i, acc);
    for (int r = 1; r < n_inputs; ++r) {
      V x[2 * kPairs];
      LoadStep<kD, kPlainInputs>(plan, pre, static_cast<const T*>(inputs[r]) + i, x);
#pragma GCC unroll 8
      for (size_t u = 0; u < 2 * kPairs; ++u) acc[u] = CombineV<Vec, kOp>(acc[u], x[u]);
    }
    ScaleStep<Vec>(plan.post.mode, post, acc);
    WireStep(plan.wire, acc);
    typename Io::Packed packed[kPairs];
#pragma GCC unroll 8
    for (size_t p = 0; p < kPairs; ++p) packed[p] = Io::Pack2(acc[2 * p], acc[2 * p + 1]);
    for (int j = 0; j < n_outputs; ++j) {
      T* dst = static_cast<T*>(outputs[j]) + i;
#pragma GCC unroll 8
      for (size_t p = 0; p < kPairs; ++p) {
        if constexpr (kStream) {
          Io::Stream2(dst + p * Io::kPairElems, packed[p]);
        } else {
          Io::Store2(dst + p * Io::kPairElems, packed[p]);
        }
      }
    }
  }
  return i;
}

template <DataType kD, FloatOp kOp, bool kStream>
HSDP_AVX2 size_t ReduceFloatAvx2(const FloatPlan<typename Avx2Io<kD>::Vec::C>& plan,
                                 const void* const* inputs, int n_inputs, void* const* outputs,
                                 int n_outputs, size_t begin, size_t end) {
  if (plan.pre.mode == ScaleMode::kNone && plan.wire == Wire::kNone) {
    return ReduceFloatAvx2Steps<kD, kOp, kStream, true>(plan, inputs, n_inputs, outputs, n_outputs,
                                                        begin, end);
  }
  return ReduceFloatAvx2Steps<kD, kOp, kStream, false>(plan, inputs, n_inputs, outputs, n_outputs,
                                                       begin, end);
}

}  // namespace

template <DataType kD, typename C, FloatOp kOp>
HSDP_AVX2 void RunFloatAvx2(const KernelOptions& options, const FloatPlan<C>& plan,
                            const void* const* inputs, int n_inputs, void* const* outputs,
                            int n_outputs, size_t count) {
  static_assert(std::is_same_v<C, typename Avx2Io<kD>::Vec::C>);
  const size_t head = StreamingHead(options.streaming_store_min_bytes, sizeof(ElemT<kD>), inputs,
                                    n_inputs, outputs, n_outputs, count);
  size_t done;
  if (head != kNoStreaming) {
    ReduceFloatScalar<kD, C, kOp>(plan, inputs, n_inputs, outputs, n_outputs, 0, head);
    done = ReduceFloatAvx2<kD, kOp, true>(plan, inputs, n_inputs, outputs, n_outputs, head, count);
    _mm_sfence();  // order the streamed stores before whatever the caller publishes next
  } else {
    done = ReduceFloatAvx2<kD, kOp, false>(plan, inputs, n_inputs, outputs, n_outputs, 0, count);
  }
  ReduceFloatScalar<kD, C, kOp>(plan, inputs, n_inputs, outputs, n_outputs, done, count);
}

#define HSDP_INSTANTIATE_FOR_OPS(kD, C)                                                      \
  template HSDP_AVX2 void RunFloatAvx2<kD, C, FloatOp::kSum>(                                \
      const KernelOptions&, const FloatPlan<C>&, const void* const*, int, void* const*, int, \
      size_t);                                                                               \
  template HSDP_AVX2 void RunFloatAvx2<kD, C, FloatOp::kProduct>(                            \
      const KernelOptions&, const FloatPlan<C>&, const void* const*, int, void* const*, int, \
      size_t);                                                                               \
  template HSDP_AVX2 void RunFloatAvx2<kD, C, FloatOp::kMin>(                                \
      const KernelOptions&, const FloatPlan<C>&, const void* const*, int, void* const*, int, \
      size_t);                                                                               \
  template HSDP_AVX2 void RunFloatAvx2<kD, C, FloatOp::kMax>(                                \
      const KernelOptions&, const FloatPlan<C>&, const void* const*, int, void* const*, int, \
      size_t);
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat32, float)
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat16, float)
HSDP_INSTANTIATE_FOR_OPS(DataType::kBFloat16, float)
HSDP_INSTANTIATE_FOR_OPS(DataType::kFloat64, double)
#undef HSDP_INSTANTIATE_FOR_OPS

}  // namespace hsdp::cpu::internal
