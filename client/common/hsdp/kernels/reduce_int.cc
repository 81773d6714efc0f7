// Integer reductions (int32, int64, uint8). One generic body on GCC vector
// extensions (32-byte vectors), compiled once for the baseline ISA (pairs of
// SSE2 registers) and once for AVX2; the compiler emulates what an ISA lacks
// (64-bit products and comparisons, 8-bit products). Like the float kernels it
// reads every input of a step before writing any output.
#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hsdp/kernels/kernel_common.h"

// The integer kernels pass 32-byte GCC vectors between always-inline helpers;
// nothing with that signature is ever called out of line, so the ABI note
// GCC emits for the baseline ISA does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace hsdp::cpu::internal {
namespace {

template <typename T>
struct IntPlan {
  bool premul = false;
  T factor = 1;  // kPremulSum
  bool avg = false;
};

template <typename T>
struct IntVec {
  typedef T V __attribute__((vector_size(32)));
  typedef std::make_unsigned_t<T> U __attribute__((vector_size(32)));
  // For loads and stores at element-aligned addresses.
  typedef T Unaligned __attribute__((vector_size(32), aligned(alignof(T)), may_alias));
  static constexpr size_t kLanes = 32 / sizeof(T);

  static V Load(const T* p) { return *reinterpret_cast<const Unaligned*>(p); }
  static void Store(T* p, V v) { *reinterpret_cast<Unaligned*>(p) = v; }
};

// Unsigned arithmetic wraps; converting back is modular (C++20). Vector casts
// between same-size vector types reinterpret the bits. `V` is T or IntVec<T>::V.
template <typename T, FloatOp kOp, typename V>
__attribute__((always_inline)) inline V CombineInt(V acc, V x) {
  using U =
      std::conditional_t<std::is_same_v<V, T>, std::make_unsigned_t<T>, typename IntVec<T>::U>;
  if constexpr (kOp == FloatOp::kSum) return (V)((U)acc + (U)x);
  if constexpr (kOp == FloatOp::kProduct) return (V)((U)acc * (U)x);
  if constexpr (kOp == FloatOp::kMax) return x > acc ? x : acc;
  if constexpr (kOp == FloatOp::kMin) return x < acc ? x : acc;
}

// Element by element, for heads and tails.
template <typename T, FloatOp kOp>
void ReduceIntElements(const IntPlan<T>& plan, const void* const* inputs, int n_inputs,
                       void* const* outputs, int n_outputs, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const auto load = [&](int r) {
      const T x = static_cast<const T*>(inputs[r])[i];
      return plan.premul ? CombineInt<T, FloatOp::kProduct>(x, plan.factor) : x;
    };
    T acc = load(0);
    for (int r = 1; r < n_inputs; ++r) acc = CombineInt<T, kOp>(acc, load(r));
    if (plan.avg) acc = static_cast<T>(static_cast<int64_t>(acc) / n_inputs);
    for (int j = 0; j < n_outputs; ++j) static_cast<T*>(outputs[j])[i] = acc;
  }
}

// Non-temporal store of one 32-byte vector (32-byte aligned), as two SSE2
// stores: baseline ISA, so the same code serves both kernel sets.
template <typename V>
__attribute__((always_inline)) inline void StreamStore32(void* p, V v) {
  typedef long long Quad __attribute__((vector_size(32)));
  const Quad q = (Quad)v;
  _mm_stream_si128(static_cast<__m128i*>(p), __builtin_shufflevector(q, q, 0, 1));
  _mm_stream_si128(static_cast<__m128i*>(p) + 1, __builtin_shufflevector(q, q, 2, 3));
}

template <typename T, FloatOp kOp, bool kStream>
__attribute__((always_inline)) inline size_t ReduceIntSteps(const IntPlan<T>& plan,
                                                            const void* const* inputs, int n_inputs,
                                                            void* const* outputs, int n_outputs,
                                                            size_t begin, size_t end) {
  using V = typename IntVec<T>::V;
  constexpr size_t kLanes = IntVec<T>::kLanes;
  constexpr size_t kUnroll = 4;
  constexpr size_t kStep = kUnroll * kLanes;
  const V factor = V{} + plan.factor;
  size_t i = begin;
  for (; end - i >= kStep; i += kStep) {
    // Input r, multiplied by the premul factor.
    const auto load = [&](int r, V(&x)[kUnroll]) {
      const T* src = static_cast<const T*>(inputs[r]) + i;
      for (size_t u = 0; u < kUnroll; ++u) x[u] = IntVec<T>::Load(src + u * kLanes);
      if (plan.premul) {
        for (size_t u = 0; u < kUnroll; ++u) x[u] = CombineInt<T, FloatOp::kProduct>(x[u], factor);
      }
    };
    V acc[kUnroll];
    load(0, acc);
    for (int r = 1; r < n_inputs; ++r) {
      V x[kUnroll];
      load(r, x);
      for (size_t u = 0; u < kUnroll; ++u) acc[u] = CombineInt<T, kOp>(acc[u], x[u]);
    }
    if (plan.avg) {
      for (size_t u = 0; u < kUnroll; ++u) {
        for (size_t l = 0; l < kLanes; ++l) {
          acc[u][l] = static_cast<T>(static_cast<int64_t>(acc[u][l]) / n_inputs);
        }
      }
    }
    for (int j = 0; j < n_outputs; ++j) {
      T* dst = static_cast<T*>(outputs[j]) + i;
      if constexpr (kStream) {
        for (size_t u = 0; u < kUnroll; ++u) StreamStore32(dst + u * kLanes, acc[u]);
      } else {
        for (size_t u = 0; u < kUnroll; ++u) IntVec<T>::Store(dst + u * kLanes, acc[u]);
      }
    }
  }
  return i;
}

template <typename T, FloatOp kOp>
__attribute__((always_inline)) inline void ReduceIntBody(const KernelOptions& options,
                                                         const IntPlan<T>& plan,
                                                         const void* const* inputs, int n_inputs,
                                                         void* const* outputs, int n_outputs,
                                                         size_t count) {
  const size_t head = StreamingHead(options.streaming_store_min_bytes, sizeof(T), inputs, n_inputs,
                                    outputs, n_outputs, count);
  size_t done;
  if (head != kNoStreaming) {
    ReduceIntElements<T, kOp>(plan, inputs, n_inputs, outputs, n_outputs, 0, head);
    done = ReduceIntSteps<T, kOp, true>(plan, inputs, n_inputs, outputs, n_outputs, head, count);
    _mm_sfence();
  } else {
    done = ReduceIntSteps<T, kOp, false>(plan, inputs, n_inputs, outputs, n_outputs, 0, count);
  }
  ReduceIntElements<T, kOp>(plan, inputs, n_inputs, outputs, n_outputs, done, count);
}

template <typename T>
__attribute__((always_inline)) inline void ReduceIntTyped(const KernelOptions& options,
                                                          const ReduceSpec& spec,
                                                          const void* const* inputs, int n_inputs,
                                                          void* const* outputs, int n_outputs,
                                                          size_t count) {
  IntPlan<T> plan;
  if (spec.op == ReduceOp::kPremulSum) {
    // Truncate toward zero, saturating to int64, then wrap into T.
    const double f = std::trunc(spec.premul_factor);
    const int64_t f64 = f != f        ? 0
                        : f >= 0x1p63 ? std::numeric_limits<int64_t>::max()
                        : f < -0x1p63 ? std::numeric_limits<int64_t>::min()
                                      : static_cast<int64_t>(f);
    plan.factor = static_cast<T>(f64);
    plan.premul = plan.factor != 1;
  }
  plan.avg = spec.op == ReduceOp::kAvg && n_inputs > 1;
  switch (spec.op) {
    case ReduceOp::kMin:
      return ReduceIntBody<T, FloatOp::kMin>(options, plan, inputs, n_inputs, outputs, n_outputs,
                                             count);
    case ReduceOp::kMax:
      return ReduceIntBody<T, FloatOp::kMax>(options, plan, inputs, n_inputs, outputs, n_outputs,
                                             count);
    case ReduceOp::kProduct:
      return ReduceIntBody<T, FloatOp::kProduct>(options, plan, inputs, n_inputs, outputs,
                                                 n_outputs, count);
    default:
      return ReduceIntBody<T, FloatOp::kSum>(options, plan, inputs, n_inputs, outputs, n_outputs,
                                             count);
  }
}

__attribute__((always_inline)) inline void ReduceIntAnyIsa(const KernelOptions& options,
                                                           const ReduceSpec& spec,
                                                           const void* const* inputs, int n_inputs,
                                                           void* const* outputs, int n_outputs,
                                                           size_t count) {
  switch (spec.dtype) {
    case DataType::kInt32:
      return ReduceIntTyped<int32_t>(options, spec, inputs, n_inputs, outputs, n_outputs, count);
    case DataType::kInt64:
      return ReduceIntTyped<int64_t>(options, spec, inputs, n_inputs, outputs, n_outputs, count);
    case DataType::kUInt8:
      return ReduceIntTyped<uint8_t>(options, spec, inputs, n_inputs, outputs, n_outputs, count);
    default:
      return;
  }
}

}  // namespace

void ReduceIntScalar(const KernelOptions& options, const ReduceSpec& spec,
                     const void* const* inputs, int n_inputs, void* const* outputs, int n_outputs,
                     size_t count) {
  ReduceIntAnyIsa(options, spec, inputs, n_inputs, outputs, n_outputs, count);
}

HSDP_AVX2 void ReduceIntAvx2(const KernelOptions& options, const ReduceSpec& spec,
                             const void* const* inputs, int n_inputs, void* const* outputs,
                             int n_outputs, size_t count) {
  ReduceIntAnyIsa(options, spec, inputs, n_inputs, outputs, n_outputs, count);
}

}  // namespace hsdp::cpu::internal
