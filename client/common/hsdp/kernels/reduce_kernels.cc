// The public entry points of the CPU kernels (Reduce, Cast and their
// explicit-option forms) and the run-time dispatch: picks the instruction set
// with __builtin_cpu_supports, builds the reduction plan, and hands the call
// to the kernel set for its dtype and op.
//
// The kernel sets live in their own files: reduce_scalar.cc (portable float),
// reduce_avx2.cc (AVX2 + F16C float), reduce_int.cc (integers, both ISAs),
// cast.cc (casts), float16_convert.{h,cc} (16-bit float formats); what they
// share is in kernel_common.h.
#include "hsdp/kernels/reduce_kernels.h"

#include <cpuid.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "hsdp/kernels/kernel_common.h"
#include "hsdp/kernels/reduce_kernels_internal.h"

namespace hsdp::cpu {
namespace internal {

namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
// not know "f16c" (GCC's does), and the sanitizer and fuzz builds use clang.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

}  // namespace

Isa BestIsa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && HasF16c() ? Isa::kAvx2 : Isa::kScalar;
  }();
  return isa;
}

namespace {

// ---------------------------------------------------------------------------
// Reduction plans.

// x * factor, with the factor rounded to C.
template <typename C>
Scale<C> Multiplier(double factor) {
  const C f = static_cast<C>(factor);
  if (f == C{1}) return {};
  return {ScaleMode::kMul, f};
}

// x / divisor, with the divisor rounded to C. Powers of two whose reciprocal is
// representable become multiplications, which round identically.
template <typename C>
Scale<C> Divider(double divisor) {
  const C d = static_cast<C>(divisor);
  if (d == C{1}) return {};
  int exponent = 0;
  const bool power_of_two =
      std::isfinite(d) && std::frexp(static_cast<double>(d), &exponent) == 0.5;
  if (power_of_two) {
    const C reciprocal = C{1} / d;
    if (std::isnormal(reciprocal)) return {ScaleMode::kMul, reciprocal};
  }
  return {ScaleMode::kDiv, d};
}

// ---------------------------------------------------------------------------
// Floating-point dispatch.

template <DataType kD, typename C, FloatOp kOp>
void RunFloat(const KernelOptions& options, const FloatPlan<C>& plan, const void* const* inputs,
              int n_inputs, void* const* outputs, int n_outputs, size_t count) {
  constexpr bool kHasAvx2 =
      std::is_same_v<C, float> ? kD != DataType::kFloat64 : kD == DataType::kFloat64;
  if constexpr (kHasAvx2) {
    // The double lanes have no wire rounding.
    if (options.isa == Isa::kAvx2 && (std::is_same_v<C, float> || plan.wire == Wire::kNone)) {
      RunFloatAvx2<kD, C, kOp>(options, plan, inputs, n_inputs, outputs, n_outputs, count);
      return;
    }
  }
  ReduceFloatScalar<kD, C, kOp>(plan, inputs, n_inputs, outputs, n_outputs, 0, count);
}

template <DataType kD, typename C>
void RunFloatOp(const KernelOptions& options, ReduceOp op, const FloatPlan<C>& plan,
                const void* const* inputs, int n_inputs, void* const* outputs, int n_outputs,
                size_t count) {
  switch (op) {
    case ReduceOp::kMin:
      return RunFloat<kD, C, FloatOp::kMin>(options, plan, inputs, n_inputs, outputs, n_outputs,
                                            count);
    case ReduceOp::kMax:
      return RunFloat<kD, C, FloatOp::kMax>(options, plan, inputs, n_inputs, outputs, n_outputs,
                                            count);
    case ReduceOp::kProduct:
      return RunFloat<kD, C, FloatOp::kProduct>(options, plan, inputs, n_inputs, outputs, n_outputs,
                                                count);
    default:  // kSum, kAvg, kPremulSum: the differences are in the plan
      return RunFloat<kD, C, FloatOp::kSum>(options, plan, inputs, n_inputs, outputs, n_outputs,
                                            count);
  }
}

template <typename C>
FloatPlan<C> MakeFloatPlan(const ReduceSpec& spec, int n_inputs, DataType wire) {
  FloatPlan<C> plan;
  plan.pre = spec.op == ReduceOp::kPremulSum ? Multiplier<C>(spec.premul_factor / spec.pre_divide)
                                             : Divider<C>(spec.pre_divide);
  plan.post =
      Divider<C>(spec.op == ReduceOp::kAvg ? spec.post_divide * n_inputs : spec.post_divide);
  switch (wire) {
    case DataType::kFloat32:
      plan.wire = std::is_same_v<C, float> ? Wire::kNone : Wire::kFloat32;
      break;
    case DataType::kFloat16:
      plan.wire = Wire::kFloat16;
      break;
    case DataType::kBFloat16:
      plan.wire = Wire::kBFloat16;
      break;
    default:  // none, or float64 (only with C = double: no rounding)
      plan.wire = Wire::kNone;
      break;
  }
  return plan;
}

template <typename C>
void ReduceFloatingPoint(const KernelOptions& options, const ReduceSpec& spec, DataType wire,
                         const void* const* inputs, int n_inputs, void* const* outputs,
                         int n_outputs, size_t count) {
  const FloatPlan<C> plan = MakeFloatPlan<C>(spec, n_inputs, wire);
  switch (spec.dtype) {
    case DataType::kFloat32:
      return RunFloatOp<DataType::kFloat32, C>(options, spec.op, plan, inputs, n_inputs, outputs,
                                               n_outputs, count);
    case DataType::kFloat16:
      return RunFloatOp<DataType::kFloat16, C>(options, spec.op, plan, inputs, n_inputs, outputs,
                                               n_outputs, count);
    case DataType::kBFloat16:
      return RunFloatOp<DataType::kBFloat16, C>(options, spec.op, plan, inputs, n_inputs, outputs,
                                                n_outputs, count);
    case DataType::kFloat64:
      if constexpr (std::is_same_v<C, double>) {
        return RunFloatOp<DataType::kFloat64, C>(options, spec.op, plan, inputs, n_inputs, outputs,
                                                 n_outputs, count);
      }
      return;
    default:
      return;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Entry points.

void ReduceWith(const KernelOptions& options, const ReduceSpec& spec, const void* const* inputs,
                int n_inputs, void* const* outputs, int n_outputs, size_t count) {
  if (count == 0 || n_inputs <= 0 || n_outputs <= 0) return;
  if (!IsFloatingPoint(spec.dtype)) {
    if (options.isa == Isa::kAvx2) {
      ReduceIntAvx2(options, spec, inputs, n_inputs, outputs, n_outputs, count);
    } else {
      ReduceIntScalar(options, spec, inputs, n_inputs, outputs, n_outputs, count);
    }
    return;
  }
  const DataType wire = spec.wire_dtype == spec.dtype ? DataType::kInvalid : spec.wire_dtype;
  if (spec.dtype == DataType::kFloat64 || wire == DataType::kFloat64) {
    ReduceFloatingPoint<double>(options, spec, wire, inputs, n_inputs, outputs, n_outputs, count);
  } else {
    ReduceFloatingPoint<float>(options, spec, wire, inputs, n_inputs, outputs, n_outputs, count);
  }
}

void CastWith(const KernelOptions& options, DataType from, const void* in, DataType to, void* out,
              size_t count) {
  if (count == 0) return;
  if (from == to) {
    if (in != out) std::memmove(out, in, count * DataTypeSize(from));
    return;
  }
  size_t done = 0;
  if (options.isa == Isa::kAvx2) done = CastAvx2(from, in, to, out, count);
  CastScalar(from, static_cast<const char*>(in) + done * DataTypeSize(from), to,
             static_cast<char*>(out) + done * DataTypeSize(to), count - done);
}

}  // namespace internal

void Reduce(const ReduceSpec& spec, const void* const* inputs, int n_inputs, void* const* outputs,
            int n_outputs, size_t count) {
  internal::ReduceWith({.isa = internal::BestIsa()}, spec, inputs, n_inputs, outputs, n_outputs,
                       count);
}

void Cast(DataType from, const void* in, DataType to, void* out, size_t count) {
  internal::CastWith({.isa = internal::BestIsa()}, from, in, to, out, count);
}

}  // namespace hsdp::cpu
