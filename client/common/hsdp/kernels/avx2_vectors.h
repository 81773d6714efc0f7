// AVX2 + F16C vector types and per-dtype loads, packs and stores, shared by
// the AVX2 reduction kernels (reduce_avx2.cc) and the AVX2 casts (cast.cc).
// Everything here is always inlined into HSDP_AVX2 functions. Internal to the
// CPU kernels.
#ifndef HSDP_KERNELS_AVX2_VECTORS_H_
#define HSDP_KERNELS_AVX2_VECTORS_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "hsdp/kernels/kernel_common.h"

namespace hsdp::cpu::internal {

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

inline constexpr int kHalfRounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

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

}  // namespace hsdp::cpu::internal

#endif  // HSDP_KERNELS_AVX2_VECTORS_H_
