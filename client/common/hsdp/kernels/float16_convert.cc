// The exported scalar 16-bit float conversions of reduce_kernels_internal.h,
// as out-of-line wrappers around float16_convert.h.
#include "hsdp/kernels/float16_convert.h"

#include <cstdint>

#include "hsdp/kernels/reduce_kernels_internal.h"

namespace hsdp::cpu::internal {

float HalfToFloat(uint16_t h) { return HalfToFloatInline(h); }
float BFloat16ToFloat(uint16_t b) { return BFloat16ToFloatInline(b); }
uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Inline(f); }
uint16_t FloatToHalf(float f) { return static_cast<uint16_t>(EncodeFromFloat<5, 10>(f)); }
uint16_t DoubleToHalf(double d) { return static_cast<uint16_t>(EncodeFromDouble<5, 10>(d)); }
uint16_t DoubleToBFloat16(double d) { return static_cast<uint16_t>(EncodeFromDouble<8, 7>(d)); }

}  // namespace hsdp::cpu::internal
