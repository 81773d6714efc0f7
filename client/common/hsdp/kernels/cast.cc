// Cast kernels: element-wise dtype conversion, scalar for every pair of
// dtypes and AVX2 + F16C for the float32/float16/bfloat16 pairs.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "hsdp/kernels/avx2_vectors.h"
#include "hsdp/kernels/float16_convert.h"
#include "hsdp/kernels/kernel_common.h"

namespace hsdp::cpu::internal {
namespace {

template <DataType kD>
double FloatToDouble(ElemT<kD> v) {
  if constexpr (kD == DataType::kFloat64)
    return v;
  else
    return ToCompute<kD, float>(v);
}

template <typename T>
T SaturatingTruncate(double d) {
  using L = std::numeric_limits<T>;
  if (d != d) return 0;
  if (d < static_cast<double>(L::min())) return L::min();
  // max + 1 is a power of two, exact in double.
  if (d >= static_cast<double>(L::max() / 2 + 1) * 2.0) return L::max();
  return static_cast<T>(d);
}

template <DataType kFrom, DataType kTo>
ElemT<kTo> ConvertElem(ElemT<kFrom> v) {
  using To = ElemT<kTo>;
  constexpr bool kFromFloat = IsFloatingPoint(kFrom);
  constexpr bool kToFloat = IsFloatingPoint(kTo);
  if constexpr (kFrom == kTo) {
    return v;
  } else if constexpr (kFromFloat && kToFloat) {
    if constexpr (kTo == DataType::kFloat64) {
      return FloatToDouble<kFrom>(v);
    } else if constexpr (kFrom == DataType::kFloat64) {
      return FromCompute<kTo, double>(v);
    } else {  // both at most float32: exact through float, one rounding
      return FromCompute<kTo, float>(ToCompute<kFrom, float>(v));
    }
  } else if constexpr (kToFloat) {  // integer -> float
    const int64_t i = v;
    if constexpr (kTo == DataType::kFloat64 || kTo == DataType::kFloat32) {
      return static_cast<To>(i);  // the hardware conversion rounds once, to nearest
    } else if constexpr (kTo == DataType::kFloat16) {
      return static_cast<To>(EncodeFromInt64<5, 10>(i));
    } else {
      return static_cast<To>(EncodeFromInt64<8, 7>(i));
    }
  } else if constexpr (kFromFloat) {  // float -> integer
    return SaturatingTruncate<To>(FloatToDouble<kFrom>(v));
  } else {  // integer -> integer, modular (C++20)
    return static_cast<To>(v);
  }
}

template <DataType kFrom, DataType kTo>
void CastScalarTyped(const void* in, void* out, size_t count) {
  const ElemT<kFrom>* src = static_cast<const ElemT<kFrom>*>(in);
  ElemT<kTo>* dst = static_cast<ElemT<kTo>*>(out);
  for (size_t i = 0; i < count; ++i) dst[i] = ConvertElem<kFrom, kTo>(src[i]);
}

template <DataType kFrom>
void CastScalarFrom(const void* in, DataType to, void* out, size_t count) {
  switch (to) {
    case DataType::kFloat32:
      return CastScalarTyped<kFrom, DataType::kFloat32>(in, out, count);
    case DataType::kFloat16:
      return CastScalarTyped<kFrom, DataType::kFloat16>(in, out, count);
    case DataType::kBFloat16:
      return CastScalarTyped<kFrom, DataType::kBFloat16>(in, out, count);
    case DataType::kFloat64:
      return CastScalarTyped<kFrom, DataType::kFloat64>(in, out, count);
    case DataType::kInt32:
      return CastScalarTyped<kFrom, DataType::kInt32>(in, out, count);
    case DataType::kInt64:
      return CastScalarTyped<kFrom, DataType::kInt64>(in, out, count);
    case DataType::kUInt8:
      return CastScalarTyped<kFrom, DataType::kUInt8>(in, out, count);
    default:
      return;
  }
}

// Casts between float32, float16 and bfloat16 through float32 lanes (exact for
// the source, so one rounding). Returns how many elements it converted.
template <DataType kFrom, DataType kTo>
HSDP_AVX2 size_t CastAvx2Typed(const void* in, void* out, size_t count) {
  const ElemT<kFrom>* src = static_cast<const ElemT<kFrom>*>(in);
  ElemT<kTo>* dst = static_cast<ElemT<kTo>*>(out);
  size_t i = 0;
  for (; count - i >= 8; i += 8) {
    Avx2Io<kTo>::Store(dst + i, Avx2Io<kTo>::Pack(Avx2Io<kFrom>::Load(src + i)));
  }
  return i;
}

template <DataType kFrom>
HSDP_AVX2 size_t CastAvx2From(const void* in, DataType to, void* out, size_t count) {
  switch (to) {
    case DataType::kFloat32:
      return CastAvx2Typed<kFrom, DataType::kFloat32>(in, out, count);
    case DataType::kFloat16:
      return CastAvx2Typed<kFrom, DataType::kFloat16>(in, out, count);
    case DataType::kBFloat16:
      return CastAvx2Typed<kFrom, DataType::kBFloat16>(in, out, count);
    default:
      return 0;
  }
}

}  // namespace

void CastScalar(DataType from, const void* in, DataType to, void* out, size_t count) {
  switch (from) {
    case DataType::kFloat32:
      return CastScalarFrom<DataType::kFloat32>(in, to, out, count);
    case DataType::kFloat16:
      return CastScalarFrom<DataType::kFloat16>(in, to, out, count);
    case DataType::kBFloat16:
      return CastScalarFrom<DataType::kBFloat16>(in, to, out, count);
    case DataType::kFloat64:
      return CastScalarFrom<DataType::kFloat64>(in, to, out, count);
    case DataType::kInt32:
      return CastScalarFrom<DataType::kInt32>(in, to, out, count);
    case DataType::kInt64:
      return CastScalarFrom<DataType::kInt64>(in, to, out, count);
    case DataType::kUInt8:
      return CastScalarFrom<DataType::kUInt8>(in, to, out, count);
    default:
      return;
  }
}

HSDP_AVX2 size_t CastAvx2(DataType from, const void* in, DataType to, void* out, size_t count) {
  switch (from) {
    case DataType::kFloat32:
      return CastAvx2From<DataType::kFloat32>(in, to, out, count);
    case DataType::kFloat16:
      return CastAvx2From<DataType::kFloat16>(in, to, out, count);
    case DataType::kBFloat16:
      return CastAvx2From<DataType::kBFloat16>(in, to, out, count);
    default:
      return 0;
  }
}

}  // namespace hsdp::cpu::internal
