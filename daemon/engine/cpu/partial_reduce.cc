#include "daemon/engine/cpu/partial_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hsdp/kernels/reduce_kernels.h"

namespace hsdp::cpu {
namespace {

// Elements per block of the paths that stage values in C.
constexpr size_t kBlock = 2048;

// The wire type whose rounding changes values computed in `c`, or kInvalid.
DataType WireRounding(const ReduceSpec& spec, DataType c) {
  if (!IsFloatingPoint(spec.dtype)) return DataType::kInvalid;
  const DataType wire = spec.wire_dtype == spec.dtype ? DataType::kInvalid : spec.wire_dtype;
  if (wire == DataType::kFloat64 || (wire == DataType::kFloat32 && c == DataType::kFloat32)) {
    return DataType::kInvalid;
  }
  return wire;
}

// The op that combines partials: the sum-like ops all add partials.
ReduceOp CombineOp(ReduceOp op) {
  return op == ReduceOp::kAvg || op == ReduceOp::kPremulSum ? ReduceOp::kSum : op;
}

// A spec that only combines values of type `c` (no scaling, no rounding).
ReduceSpec PlainSpec(DataType c, ReduceOp op) {
  ReduceSpec s;
  s.dtype = c;
  s.op = CombineOp(op);
  return s;
}

template <typename C>
void ScaleBlock(const ReduceSpec& spec, C* x, size_t len) {
  if (spec.op == ReduceOp::kPremulSum) {
    const C f = static_cast<C>(spec.premul_factor / spec.pre_divide);
    if (f != C{1}) {
      for (size_t k = 0; k < len; ++k) x[k] *= f;
    }
    return;
  }
  // Division; Reduce's reciprocal multiplication for powers of two rounds
  // identically.
  const C d = static_cast<C>(spec.pre_divide);
  if (d != C{1}) {
    for (size_t k = 0; k < len; ++k) x[k] /= d;
  }
}

// Rounds `len` values of type `c` at `x` to `wire` and back.
void RoundThroughWire(DataType c, DataType wire, void* x, void* scratch, size_t len) {
  if (wire == DataType::kInvalid) return;
  Cast(c, x, wire, scratch, len);
  Cast(wire, scratch, c, x, len);
}

// x (type c) = input block converted to c, pre-scaled and wire-rounded.
void LoadBlock(const ReduceSpec& spec, DataType c, DataType wire, const void* in, void* x,
               void* scratch, size_t len) {
  Cast(spec.dtype, in, c, x, len);
  if (c == DataType::kFloat64) {
    ScaleBlock(spec, static_cast<double*>(x), len);
  } else {
    ScaleBlock(spec, static_cast<float*>(x), len);
  }
  RoundThroughWire(c, wire, x, scratch, len);
}

template <typename T>
void DivideIntegers(T* x, size_t len, int n) {
  for (size_t k = 0; k < len; ++k) x[k] = static_cast<T>(static_cast<int64_t>(x[k]) / n);
}

}  // namespace

DataType PartialType(const ReduceSpec& spec) {
  if (!IsFloatingPoint(spec.dtype)) return spec.dtype;
  return spec.dtype == DataType::kFloat64 || spec.wire_dtype == DataType::kFloat64
             ? DataType::kFloat64
             : DataType::kFloat32;
}

bool PartialIsIdentity(const ReduceSpec& spec) {
  const DataType c = PartialType(spec);
  if (c != spec.dtype || WireRounding(spec, c) != DataType::kInvalid) return false;
  if (!IsFloatingPoint(spec.dtype)) return spec.op != ReduceOp::kPremulSum;
  const double scale =
      spec.op == ReduceOp::kPremulSum ? spec.premul_factor / spec.pre_divide : spec.pre_divide;
  return c == DataType::kFloat64 ? scale == 1.0 : static_cast<float>(scale) == 1.0f;
}

void ReducePartial(const ReduceSpec& spec, const void* const* inputs, int n_inputs, void* partial,
                   size_t count) {
  if (count == 0 || n_inputs <= 0) return;
  const DataType c = PartialType(spec);
  const DataType wire = WireRounding(spec, c);
  if (c == spec.dtype && wire == DataType::kInvalid) {
    // The kernel's own pass; rounding to dtype (== C) changes nothing.
    ReduceSpec s = spec;
    if (s.op == ReduceOp::kAvg) s.op = ReduceOp::kSum;
    s.post_divide = 1.0;
    void* out = partial;
    Reduce(s, inputs, n_inputs, &out, 1, count);
    return;
  }
  const size_t cs = DataTypeSize(c);
  std::vector<char> staged(static_cast<size_t>(n_inputs) * kBlock * cs);
  std::vector<char> scratch(kBlock * cs);
  std::vector<const void*> x(n_inputs);
  const ReduceSpec plain = PlainSpec(c, spec.op);
  const size_t es = DataTypeSize(spec.dtype);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    for (int r = 0; r < n_inputs; ++r) {
      char* xr = staged.data() + static_cast<size_t>(r) * kBlock * cs;
      LoadBlock(spec, c, wire, static_cast<const char*>(inputs[r]) + base * es, xr, scratch.data(),
                len);
      x[r] = xr;
    }
    void* out = static_cast<char*>(partial) + base * cs;
    Reduce(plain, x.data(), n_inputs, &out, 1, len);
  }
}

void CombinePartials(const ReduceSpec& spec, const void* const* partials, int n_partials, void* out,
                     size_t count) {
  if (count == 0 || n_partials <= 0) return;
  Reduce(PlainSpec(PartialType(spec), spec.op), partials, n_partials, &out, 1, count);
}

void FinishPartials(const ReduceSpec& spec, int total_inputs, const void* const* partials,
                    int n_partials, void* const* outputs, int n_outputs, size_t count) {
  if (count == 0 || n_partials <= 0 || n_outputs <= 0) return;
  const DataType c = PartialType(spec);
  const DataType wire = WireRounding(spec, c);
  const bool avg = spec.op == ReduceOp::kAvg;
  ReduceSpec combine = PlainSpec(c, spec.op);
  if (!IsFloatingPoint(spec.dtype)) {
    if (!avg) {
      Reduce(combine, partials, n_partials, outputs, n_outputs, count);
      return;
    }
    // Integer average: the wrapped sum divided by the group size, truncating.
    const size_t es = DataTypeSize(spec.dtype);
    std::vector<char> block(kBlock * es);
    for (size_t base = 0; base < count; base += kBlock) {
      const size_t len = std::min(kBlock, count - base);
      std::vector<const void*> in(n_partials);
      for (int r = 0; r < n_partials; ++r) in[r] = static_cast<const char*>(partials[r]) + base * es;
      void* tmp = block.data();
      Reduce(combine, in.data(), n_partials, &tmp, 1, len);
      switch (spec.dtype) {
        case DataType::kInt32:
          DivideIntegers(static_cast<int32_t*>(tmp), len, total_inputs);
          break;
        case DataType::kInt64:
          DivideIntegers(static_cast<int64_t*>(tmp), len, total_inputs);
          break;
        default:
          DivideIntegers(static_cast<uint8_t*>(tmp), len, total_inputs);
          break;
      }
      for (int j = 0; j < n_outputs; ++j) {
        std::memcpy(static_cast<char*>(outputs[j]) + base * es, tmp, len * es);
      }
    }
    return;
  }
  combine.post_divide = avg ? spec.post_divide * total_inputs : spec.post_divide;
  if (c == spec.dtype && wire == DataType::kInvalid) {
    Reduce(combine, partials, n_partials, outputs, n_outputs, count);
    return;
  }
  const size_t cs = DataTypeSize(c);
  const size_t es = DataTypeSize(spec.dtype);
  std::vector<char> block(kBlock * cs);
  std::vector<char> scratch(kBlock * cs);
  std::vector<const void*> in(n_partials);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    for (int r = 0; r < n_partials; ++r) in[r] = static_cast<const char*>(partials[r]) + base * cs;
    void* tmp = block.data();
    Reduce(combine, in.data(), n_partials, &tmp, 1, len);  // combined and divided, in C
    RoundThroughWire(c, wire, tmp, scratch.data(), len);
    char* first = static_cast<char*>(outputs[0]) + base * es;
    Cast(c, tmp, spec.dtype, first, len);
    for (int j = 1; j < n_outputs; ++j) {
      std::memcpy(static_cast<char*>(outputs[j]) + base * es, first, len * es);
    }
  }
}

}  // namespace hsdp::cpu
