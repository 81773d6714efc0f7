// Element-wise reduction and cast kernels of the CPU engine.
//
// Structure:
//   * scalar number-format conversions (binary16, bfloat16) in plain C++;
//   * a portable "scalar" kernel set, written as short loops over blocks so the
//     compiler can vectorise the simple cases for the baseline ISA;
//   * an AVX2 + F16C kernel set (GCC target attribute, selected at run time
//     with __builtin_cpu_supports) for the hot dtypes.
// Both sets perform exactly the same IEEE operations in the same order, so they
// produce bit-identical results; the AVX2 kernels hand their unaligned head and
// short tail to the scalar kernels. No fused multiply-add is ever enabled (it
// would change roundings).
#include "daemon/engine/cpu/reduce_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "daemon/engine/cpu/reduce_kernels_internal.h"

// The integer kernels pass 32-byte GCC vectors between always-inline helpers;
// nothing with that signature is ever called out of line, so the ABI note
// GCC emits for the baseline ISA does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#define HSDP_AVX2 __attribute__((target("avx2,f16c")))
#define HSDP_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace hsdp::cpu {
namespace internal {
namespace {

// ---------------------------------------------------------------------------
// Number formats.

// Rounds the exact value (-1)^negative * sig * 2^exp2 to the IEEE-754 binary
// format with kExpBits exponent bits and kManBits stored mantissa bits (round
// to nearest, ties to even; overflow to infinity; subnormals kept) and returns
// its encoding. The value must be finite.
template <int kExpBits, int kManBits>
uint32_t EncodeExact(bool negative, uint64_t sig, int exp2) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr uint64_t kInf = uint64_t{(1u << kExpBits) - 1} << kManBits;
  const uint32_t sign = negative ? uint32_t{1} << (kExpBits + kManBits) : 0;
  if (sig == 0) return sign;
  const int top = 63 - std::countl_zero(sig);
  const int exponent = top + exp2;  // the value lies in [2^exponent, 2^(exponent+1))
  const bool normal = exponent >= 1 - kBias;
  // Bit of `sig` that becomes the unit in the last place of the result: normals
  // keep kManBits bits below the leading one; subnormals have a fixed ulp.
  const int ulp_bit = (normal ? exponent - kManBits : 1 - kBias - kManBits) - exp2;
  uint64_t q;  // the result's significand, in ulps
  if (ulp_bit <= 0) {
    q = sig << -ulp_bit;  // exact; top - ulp_bit <= kManBits, so no overflow
  } else if (ulp_bit > 64) {
    q = 0;  // sig < 2^64 <= half an ulp
  } else {
    q = ulp_bit == 64 ? 0 : sig >> ulp_bit;
    const uint64_t rest = ulp_bit == 64 ? sig : sig & ((uint64_t{1} << ulp_bit) - 1);
    const uint64_t half = uint64_t{1} << (ulp_bit - 1);
    if (rest > half || (rest == half && (q & 1) != 0)) ++q;
  }
  // For normals q includes the implicit leading one (bit kManBits), which adds
  // one to the exponent field; a rounding carry moves into the exponent (or
  // from the largest subnormal to the smallest normal) by itself.
  const uint64_t exponent_field = normal ? uint64_t(exponent + kBias - 1) : 0;
  const uint64_t encoded = std::min((exponent_field << kManBits) + q, kInf);
  return sign | static_cast<uint32_t>(encoded);
}

// Infinity or quiet NaN in the target format; `payload_top` holds the top
// kManBits bits of the source NaN's payload (ignored for infinity).
template <int kExpBits, int kManBits>
uint32_t EncodeNonFinite(bool negative, bool is_nan, uint64_t payload_top) {
  const uint32_t sign = negative ? uint32_t{1} << (kExpBits + kManBits) : 0;
  const uint32_t inf = ((uint32_t{1} << kExpBits) - 1) << kManBits;
  if (!is_nan) return sign | inf;
  return sign | inf | (uint32_t{1} << (kManBits - 1)) | static_cast<uint32_t>(payload_top);
}

template <int kExpBits, int kManBits>
uint32_t EncodeFromFloat(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const bool negative = (bits >> 31) != 0;
  const int biased = static_cast<int>((bits >> 23) & 0xFF);
  const uint32_t mantissa = bits & 0x7FFFFF;
  if (biased == 0xFF) {
    return EncodeNonFinite<kExpBits, kManBits>(negative, mantissa != 0,
                                               mantissa >> (23 - kManBits));
  }
  if (biased == 0) return EncodeExact<kExpBits, kManBits>(negative, mantissa, -149);
  return EncodeExact<kExpBits, kManBits>(negative, mantissa | 0x800000, biased - 150);
}

template <int kExpBits, int kManBits>
uint32_t EncodeFromDouble(double d) {
  const uint64_t bits = std::bit_cast<uint64_t>(d);
  const bool negative = (bits >> 63) != 0;
  const int biased = static_cast<int>((bits >> 52) & 0x7FF);
  const uint64_t mantissa = bits & ((uint64_t{1} << 52) - 1);
  if (biased == 0x7FF) {
    return EncodeNonFinite<kExpBits, kManBits>(negative, mantissa != 0,
                                               mantissa >> (52 - kManBits));
  }
  if (biased == 0) return EncodeExact<kExpBits, kManBits>(negative, mantissa, -1074);
  return EncodeExact<kExpBits, kManBits>(negative, mantissa | (uint64_t{1} << 52), biased - 1075);
}

template <int kExpBits, int kManBits>
uint32_t EncodeFromInt64(int64_t v) {
  // Magnitude without overflow for INT64_MIN.
  const uint64_t magnitude = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : uint64_t(v);
  return EncodeExact<kExpBits, kManBits>(v < 0, magnitude, 0);
}

// The cheap conversions, always inlined into the kernels (the exported
// functions below wrap them).
__attribute__((always_inline)) inline float HalfToFloatInline(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t biased = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FFu;
  if (biased == 0x1F) {  // inf, or NaN made quiet (as VCVTPH2PS does)
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) |
                                (mantissa != 0 ? 0x400000u : 0u));
  }
  if (biased == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((biased + 112) << 23) | (mantissa << 13));
}

__attribute__((always_inline)) inline float BFloat16ToFloatInline(uint16_t b) {
  return std::bit_cast<float>(uint32_t{b} << 16);
}

__attribute__((always_inline)) inline uint16_t FloatToBFloat16Inline(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  // Adding 0x7FFF (+1 when the kept part is odd) carries into bit 16 exactly
  // when the dropped half is above the midpoint, or at it with an odd result.
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40;
  // Branch-free so that loops over it vectorise.
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

}  // namespace

float HalfToFloat(uint16_t h) { return HalfToFloatInline(h); }
float BFloat16ToFloat(uint16_t b) { return BFloat16ToFloatInline(b); }
uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Inline(f); }
uint16_t FloatToHalf(float f) { return static_cast<uint16_t>(EncodeFromFloat<5, 10>(f)); }
uint16_t DoubleToHalf(double d) { return static_cast<uint16_t>(EncodeFromDouble<5, 10>(d)); }
uint16_t DoubleToBFloat16(double d) { return static_cast<uint16_t>(EncodeFromDouble<8, 7>(d)); }

Isa BestIsa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? Isa::kAvx2
                                                                            : Isa::kScalar;
  }();
  return isa;
}

namespace {

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
      return FloatToHalf(v);
    else
      return DoubleToHalf(v);
  } else if constexpr (kD == DataType::kBFloat16) {
    if constexpr (std::is_same_v<C, float>)
      return FloatToBFloat16Inline(v);
    else
      return DoubleToBFloat16(v);
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
// Scalar kernel set: floating point.

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

// ---------------------------------------------------------------------------
// AVX2 kernel set: floating point.

// 8 x float32 lanes.
struct VecF32 {
  using V = __m256;
  using C = float;
  static constexpr size_t kLanes = 8;
  static HSDP_AVX2_INLINE V Set1(C c) { return _mm256_set1_ps(c); }
  static HSDP_AVX2_INLINE V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static HSDP_AVX2_INLINE V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static HSDP_AVX2_INLINE V Div(V a, V b) { return _mm256_div_ps(a, b); }
  // a > b ? a : b (b when either is NaN), like the scalar expression.
  static HSDP_AVX2_INLINE V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static HSDP_AVX2_INLINE V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static HSDP_AVX2_INLINE V IsNan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static HSDP_AVX2_INLINE V Select(V mask, V if_set, V if_clear) {
    return _mm256_blendv_ps(if_clear, if_set, mask);
  }
};

// 4 x float64 lanes.
struct VecF64 {
  using V = __m256d;
  using C = double;
  static constexpr size_t kLanes = 4;
  static HSDP_AVX2_INLINE V Set1(C c) { return _mm256_set1_pd(c); }
  static HSDP_AVX2_INLINE V Add(V a, V b) { return _mm256_add_pd(a, b); }
  static HSDP_AVX2_INLINE V Mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static HSDP_AVX2_INLINE V Div(V a, V b) { return _mm256_div_pd(a, b); }
  static HSDP_AVX2_INLINE V Max(V a, V b) { return _mm256_max_pd(a, b); }
  static HSDP_AVX2_INLINE V Min(V a, V b) { return _mm256_min_pd(a, b); }
  static HSDP_AVX2_INLINE V IsNan(V a) { return _mm256_cmp_pd(a, a, _CMP_UNORD_Q); }
  static HSDP_AVX2_INLINE V Select(V mask, V if_set, V if_clear) {
    return _mm256_blendv_pd(if_clear, if_set, mask);
  }
};

// Rounds float32 lanes to bfloat16 (bit-identical to FloatToBFloat16): the
// high 16 bits of each lane are the bfloat16 encoding; the low 16 bits are
// left over and must be masked or shifted out by the caller.
HSDP_AVX2_INLINE __m256i BFloat16InHighHalf(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i quiet_nan = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

// bfloat16 encodings in the low 16 bits of each lane.
HSDP_AVX2_INLINE __m256i BFloat16Bits(__m256 x) {
  return _mm256_srli_epi32(BFloat16InHighHalf(x), 16);
}

// x rounded to bfloat16, as float32.
HSDP_AVX2_INLINE __m256 RoundToBFloat16(__m256 x) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(BFloat16InHighHalf(x), _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

HSDP_AVX2_INLINE __m128i PackLow16(__m256i v) {
  return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

constexpr int kHalfRounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// Loads and stores of one dtype as compute vectors.
//   Load / Pack / Store: 8 (float64: 4) elements in order (used by Cast).
//   Load2 / Pack2 / Store2 / Stream2: a pair of vectors, kPairElems elements
//     (used by Reduce). The pair's lane order may be a permutation of memory
//     order (bfloat16: even elements in one vector, odd in the other), undone
//     by Pack2; only element-wise work may happen in between. Pack2 encodes
//     once for all the outputs. Stream2 is a non-temporal store and needs
//     32-byte alignment (fp16: 16-byte).
template <DataType kD>
struct Avx2Io;

template <>
struct Avx2Io<DataType::kFloat32> {
  using Vec = VecF32;
  static constexpr size_t kPairElems = 16;
  struct Packed {
    __m256 lo, hi;
  };
  static HSDP_AVX2_INLINE __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
  static HSDP_AVX2_INLINE __m256 Pack(__m256 v) { return v; }
  static HSDP_AVX2_INLINE void Store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

  static HSDP_AVX2_INLINE void Load2(const float* p, __m256& a, __m256& b) {
    a = _mm256_loadu_ps(p);
    b = _mm256_loadu_ps(p + 8);
  }
  static HSDP_AVX2_INLINE Packed Pack2(__m256 a, __m256 b) { return {a, b}; }
  static HSDP_AVX2_INLINE void Store2(float* p, const Packed& v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  static HSDP_AVX2_INLINE void Stream2(float* p, const Packed& v) {
    _mm256_stream_ps(p, v.lo);
    _mm256_stream_ps(p + 8, v.hi);
  }
};

template <>
struct Avx2Io<DataType::kFloat16> {
  using Vec = VecF32;
  static constexpr size_t kPairElems = 16;
  struct Packed {
    __m128i lo, hi;
  };
  static HSDP_AVX2_INLINE __m256 Load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static HSDP_AVX2_INLINE __m128i Pack(__m256 v) { return _mm256_cvtps_ph(v, kHalfRounding); }
  static HSDP_AVX2_INLINE void Store(uint16_t* p, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }

  static HSDP_AVX2_INLINE void Load2(const uint16_t* p, __m256& a, __m256& b) {
    a = Load(p);
    b = Load(p + 8);
  }
  static HSDP_AVX2_INLINE Packed Pack2(__m256 a, __m256 b) { return {Pack(a), Pack(b)}; }
  static HSDP_AVX2_INLINE void Store2(uint16_t* p, const Packed& v) {
    Store(p, v.lo);
    Store(p + 8, v.hi);
  }
  static HSDP_AVX2_INLINE void Stream2(uint16_t* p, const Packed& v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), v.lo);
    _mm_stream_si128(reinterpret_cast<__m128i*>(p + 8), v.hi);
  }
};

template <>
struct Avx2Io<DataType::kBFloat16> {
  using Vec = VecF32;
  static constexpr size_t kPairElems = 16;
  using Packed = __m256i;
  static HSDP_AVX2_INLINE __m256 Load(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static HSDP_AVX2_INLINE __m128i Pack(__m256 v) { return PackLow16(BFloat16Bits(v)); }
  static HSDP_AVX2_INLINE void Store(uint16_t* p, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }

  // A bfloat16 is the high half of a float32: a = the even elements (shifted
  // up), b = the odd ones (masked). Pack2 interleaves them back.
  static HSDP_AVX2_INLINE void Load2(const uint16_t* p, __m256& a, __m256& b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static HSDP_AVX2_INLINE Packed Pack2(__m256 a, __m256 b) {
    return _mm256_blend_epi16(_mm256_srli_epi32(BFloat16InHighHalf(a), 16), BFloat16InHighHalf(b),
                              0xAA);
  }
  static HSDP_AVX2_INLINE void Store2(uint16_t* p, const Packed& v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  static HSDP_AVX2_INLINE void Stream2(uint16_t* p, const Packed& v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  }
};

template <>
struct Avx2Io<DataType::kFloat64> {
  using Vec = VecF64;
  static constexpr size_t kPairElems = 8;
  struct Packed {
    __m256d lo, hi;
  };
  static HSDP_AVX2_INLINE void Load2(const double* p, __m256d& a, __m256d& b) {
    a = _mm256_loadu_pd(p);
    b = _mm256_loadu_pd(p + 4);
  }
  static HSDP_AVX2_INLINE Packed Pack2(__m256d a, __m256d b) { return {a, b}; }
  static HSDP_AVX2_INLINE void Store2(double* p, const Packed& v) {
    _mm256_storeu_pd(p, v.lo);
    _mm256_storeu_pd(p + 4, v.hi);
  }
  static HSDP_AVX2_INLINE void Stream2(double* p, const Packed& v) {
    _mm256_stream_pd(p, v.lo);
    _mm256_stream_pd(p + 4, v.hi);
  }
};

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

constexpr size_t kNoStreaming = std::numeric_limits<size_t>::max();
constexpr uintptr_t kStreamAlignment = 32;

// Whether to write with non-temporal stores, and if so how many leading
// elements to leave to regular stores so that every output is 32-byte aligned
// for the rest. kNoStreaming when not streaming.
size_t StreamingHead(size_t min_bytes, size_t elem_size, const void* const* inputs, int n_inputs,
                     void* const* outputs, int n_outputs, size_t count) {
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

template <DataType kD, FloatOp kOp>
HSDP_AVX2 void RunFloatAvx2(const KernelOptions& options,
                            const FloatPlan<typename Avx2Io<kD>::Vec::C>& plan,
                            const void* const* inputs, int n_inputs, void* const* outputs,
                            int n_outputs, size_t count) {
  using C = typename Avx2Io<kD>::Vec::C;
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
      RunFloatAvx2<kD, kOp>(options, plan, inputs, n_inputs, outputs, n_outputs, count);
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

// ---------------------------------------------------------------------------
// Integers. One generic body on GCC vector extensions (32-byte vectors),
// compiled once for the baseline ISA (pairs of SSE2 registers) and once for
// AVX2; the compiler emulates what an ISA lacks (64-bit products and
// comparisons, 8-bit products). Like the float kernels it reads every input of
// a step before writing any output.

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

// ---------------------------------------------------------------------------
// Casts.

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
