// Scalar encode/decode of the 16-bit float formats (IEEE binary16 and
// bfloat16) from and to float, double and int64, shared by the kernel files.
// Internal to the CPU kernels; tests use the exported wrappers declared in
// reduce_kernels_internal.h (defined in float16_convert.cc).
#ifndef HSDP_KERNELS_FLOAT16_CONVERT_H_
#define HSDP_KERNELS_FLOAT16_CONVERT_H_

#include <algorithm>
#include <bit>
#include <cstdint>

namespace hsdp::cpu::internal {

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
// functions of reduce_kernels_internal.h wrap them).
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

}  // namespace hsdp::cpu::internal

#endif  // HSDP_KERNELS_FLOAT16_CONVERT_H_
