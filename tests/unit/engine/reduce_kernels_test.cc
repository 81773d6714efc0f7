// Tests of the CPU engine's reduce and cast kernels against references computed
// here independently (float64 arithmetic, frexp/ldexp/nearbyint roundings,
// exact integer arithmetic), on both the scalar and the AVX2 kernel sets.
#include "hsdp/kernels/reduce_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/reduce_reference.h"  // Combine
#include "hsdp/kernels/reduce_kernels_internal.h"

namespace hsdp::cpu {
namespace {

using ::hsdp::testing::Combine;
using internal::Isa;
using internal::KernelOptions;

constexpr DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                                  DataType::kFloat64, DataType::kInt32,   DataType::kInt64,
                                  DataType::kUInt8};
constexpr DataType kFloatTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                                    DataType::kFloat64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum,
                                ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
constexpr int kInputCounts[] = {1, 2, 3, 4, 7};
constexpr size_t kCounts[] = {1, 7, 1023, 4097, 100003};

bool HaveAvx2() { return internal::BestIsa() == Isa::kAvx2; }

#define SKIP_IF_UNSUPPORTED(isa)                                            \
  do {                                                                      \
    if ((isa) == Isa::kAvx2 && !HaveAvx2()) GTEST_SKIP() << "no AVX2/F16C"; \
  } while (0)

std::string IsaName(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "scalar"; }

// ---------------------------------------------------------------------------
// Reference number formats.

struct Format {
  int precision;     // significant bits, the implicit one included
  int min_exponent;  // exponent of the smallest normal
  double max_finite;
};
constexpr Format kHalf{11, -14, 65504.0};
constexpr Format kBFloat{8, -126, 0x1.FEp127};
constexpr Format kSingle{24, -126, 0x1.FFFFFEp127};

// x rounded to nearest-even in `f` (subnormals kept, overflow to inf).
double RefRound(double x, const Format& f) {
  if (!std::isfinite(x) || x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, f.min_exponent);
  const double ulp = std::ldexp(1.0, lead - (f.precision - 1));
  const double r = std::nearbyint(x / ulp) * ulp;  // default rounding mode: to nearest even
  if (std::fabs(r) > f.max_finite) return std::copysign(INFINITY, x);
  return r;
}

double RefHalfToDouble(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0x1F) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

double RefBFloat16ToDouble(uint16_t b) {
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  if (e == 0xFF) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -133);
  return sign * std::ldexp(128 + m, e - 134);
}

// Exactly representable values only (asserted by the round trip).
uint16_t RefHalfBits(double v) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double d = RefHalfToDouble(static_cast<uint16_t>(h));
    if (d == v && std::signbit(d) == std::signbit(v)) return static_cast<uint16_t>(h);
  }
  ADD_FAILURE() << v << " is not a float16 value";
  return 0;
}
uint16_t RefBFloat16Bits(double v) {
  const float f = static_cast<float>(v);
  EXPECT_EQ(static_cast<double>(f), v);
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  EXPECT_EQ(bits & 0xFFFF, 0u) << v << " is not a bfloat16 value";
  return static_cast<uint16_t>(bits >> 16);
}

// ---------------------------------------------------------------------------
// Typed buffers.

// `count` elements of `type`, 64-byte aligned, plus 64 bytes of slack so tests
// can offset the start.
class Buffer {
 public:
  Buffer(DataType t, size_t n)
      : type(t), count(n), size_(n * DataTypeSize(t) + 64), storage_(new uint8_t[size_ + 64]()) {}
  Buffer(const Buffer& other) : Buffer(other.type, other.count) {
    std::memcpy(data(), other.data(), size_);
  }
  Buffer(Buffer&&) = default;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() {
    const uintptr_t p = reinterpret_cast<uintptr_t>(storage_.get());
    return storage_.get() + ((64 - p % 64) % 64);
  }
  const uint8_t* data() const { return const_cast<Buffer*>(this)->data(); }
  size_t size_bytes() const { return size_; }

  DataType type;
  size_t count;

 private:
  size_t size_;
  std::unique_ptr<uint8_t[]> storage_;
};

template <typename T>
T Load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void StoreAt(void* p, size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
}

// Exact value of element i (integers: exact below 2^53, used for float types).
double GetDouble(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32:
      return Load<float>(p, i);
    case DataType::kFloat16:
      return RefHalfToDouble(Load<uint16_t>(p, i));
    case DataType::kBFloat16:
      return RefBFloat16ToDouble(Load<uint16_t>(p, i));
    case DataType::kFloat64:
      return Load<double>(p, i);
    case DataType::kInt32:
      return Load<int32_t>(p, i);
    case DataType::kInt64:
      return static_cast<double>(Load<int64_t>(p, i));
    case DataType::kUInt8:
      return Load<uint8_t>(p, i);
    default:
      return 0;
  }
}

// Stores an exactly representable value.
void SetDouble(DataType t, void* p, size_t i, double v) {
  if (std::isnan(v) && t == DataType::kFloat16) return StoreAt<uint16_t>(p, i, 0x7E00);
  if (std::isnan(v) && t == DataType::kBFloat16) return StoreAt<uint16_t>(p, i, 0x7FC0);
  switch (t) {
    case DataType::kFloat32:
      return StoreAt<float>(p, i, static_cast<float>(v));
    case DataType::kFloat16:
      return StoreAt<uint16_t>(p, i, RefHalfBits(v));
    case DataType::kBFloat16:
      return StoreAt<uint16_t>(p, i, RefBFloat16Bits(v));
    case DataType::kFloat64:
      return StoreAt<double>(p, i, v);
    case DataType::kInt32:
      return StoreAt<int32_t>(p, i, static_cast<int32_t>(v));
    case DataType::kInt64:
      return StoreAt<int64_t>(p, i, static_cast<int64_t>(v));
    case DataType::kUInt8:
      return StoreAt<uint8_t>(p, i, static_cast<uint8_t>(v));
    default:
      return;
  }
}

// Random element values. Floats: random sign and exponent, random mantissa
// bits (so every value is exact in the type); for kProduct magnitudes stay in
// [0.5, 2) so seven factors cannot overflow float16. Integers: all bits random.
void FillRandom(Buffer& b, ReduceOp op, std::mt19937_64& rng) {
  const bool product = op == ReduceOp::kProduct;
  for (size_t i = 0; i < b.count; ++i) {
    const uint64_t r = rng();
    const bool negative = (r >> 63) != 0;
    switch (b.type) {
      case DataType::kFloat16: {
        // exponent field 14..15 ([0.5, 2)) or 0..17 (subnormals up to 8).
        const uint32_t e = product ? 14 + (r >> 20) % 2 : (r >> 20) % 18;
        StoreAt<uint16_t>(b.data(), i,
                          static_cast<uint16_t>((negative ? 0x8000 : 0) | (e << 10) | (r & 0x3FF)));
        break;
      }
      case DataType::kBFloat16: {
        const uint32_t e = product ? 126 + (r >> 20) % 2 : 100 + (r >> 20) % 30;
        StoreAt<uint16_t>(b.data(), i,
                          static_cast<uint16_t>((negative ? 0x8000 : 0) | (e << 7) | (r & 0x7F)));
        break;
      }
      case DataType::kFloat32: {
        const uint32_t e = product ? 126 + (r >> 30) % 2 : 100 + (r >> 30) % 30;
        StoreAt<uint32_t>(
            b.data(), i,
            (negative ? 0x80000000u : 0u) | (e << 23) | static_cast<uint32_t>(r & 0x7FFFFF));
        break;
      }
      case DataType::kFloat64: {
        const uint64_t e = product ? 1022 + (r >> 60) % 2 : 1000 + (r >> 56) % 30;
        StoreAt<uint64_t>(
            b.data(), i,
            (negative ? uint64_t{1} << 63 : 0) | (e << 52) | (rng() & ((uint64_t{1} << 52) - 1)));
        break;
      }
      case DataType::kInt32:
        StoreAt<int32_t>(b.data(), i, static_cast<int32_t>(r));
        break;
      case DataType::kInt64:
        StoreAt<int64_t>(b.data(), i, static_cast<int64_t>(r));
        break;
      case DataType::kUInt8:
        StoreAt<uint8_t>(b.data(), i, static_cast<uint8_t>(r));
        break;
      default:
        break;
    }
  }
}

// ---------------------------------------------------------------------------
// Reference reductions.

double AccumulationEpsilon(DataType t) { return t == DataType::kFloat64 ? 0x1p-53 : 0x1p-24; }
double OutputEpsilon(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return 0x1p-11;
    case DataType::kBFloat16:
      return 0x1p-8;
    case DataType::kFloat32:
      return 0x1p-24;
    default:
      return 0x1p-53;
  }
}
double SmallestSubnormal(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return 0x1p-24;
    case DataType::kBFloat16:
      return 0x1p-133;
    case DataType::kFloat32:
      return 0x1p-149;
    default:
      return std::numeric_limits<double>::denorm_min();
  }
}

// Checks `out` against a float64 reference of spec over `inputs`, with an
// error bound derived from the accumulation and output precisions. Returns
// the number of mismatches (reports the first few).
int CheckFloatReduction(const ReduceSpec& spec, const std::vector<Buffer>& inputs, const void* out,
                        size_t count, const std::string& what) {
  const DataType t = spec.dtype;
  const int n = static_cast<int>(inputs.size());
  const double scale = spec.op == ReduceOp::kPremulSum ? spec.premul_factor / spec.pre_divide
                                                       : 1.0 / spec.pre_divide;
  const double divisor = spec.post_divide * (spec.op == ReduceOp::kAvg ? n : 1);
  const double eps = AccumulationEpsilon(t);
  int failures = 0;
  for (size_t i = 0; i < count; ++i) {
    double ref = 0, magnitude = 0, tol = 0;
    for (int r = 0; r < n; ++r) {
      const double x = GetDouble(t, inputs[r].data(), i) * scale;
      ref = r == 0 ? x : Combine(spec.op, ref, x);
      magnitude += std::fabs(x);
    }
    ref /= divisor;
    magnitude /= divisor;
    switch (spec.op) {
      case ReduceOp::kMin:
      case ReduceOp::kMax:
        tol = 3 * eps * std::fabs(ref);
        break;
      case ReduceOp::kProduct:
        tol = (2 * n + 4) * eps * std::fabs(ref);
        break;
      default:
        tol = (n + 3) * eps * magnitude;
        break;
    }
    tol += OutputEpsilon(t) * std::fabs(ref) + SmallestSubnormal(t);
    // Unscaled min/max select one input: exact.
    const bool selects = spec.op == ReduceOp::kMin || spec.op == ReduceOp::kMax;
    if (selects && scale == 1 && divisor == 1) tol = 0;
    const double got = GetDouble(t, out, i);
    if (!(std::fabs(got - ref) <= tol)) {
      if (++failures <= 5) {
        ADD_FAILURE() << what << " element " << i << ": got " << got << ", want " << ref << " +- "
                      << tol;
      }
    }
  }
  return failures;
}

template <typename T>
int CheckIntReductionTyped(const ReduceSpec& spec, const std::vector<Buffer>& inputs,
                           const void* out, size_t count, const std::string& what) {
  const int n = static_cast<int>(inputs.size());
  const uint64_t factor = static_cast<uint64_t>(static_cast<int64_t>(spec.premul_factor));
  int failures = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t acc = 0;  // wraps mod 2^64, truncated to T at the end (mod 2^bits)
    T best = Load<T>(inputs[0].data(), i);
    for (int r = 0; r < n; ++r) {
      const T v = Load<T>(inputs[r].data(), i);
      uint64_t x = static_cast<uint64_t>(static_cast<int64_t>(v));
      if (spec.op == ReduceOp::kPremulSum) x *= factor;
      if (spec.op == ReduceOp::kProduct) {
        acc = r == 0 ? x : acc * x;
      } else {
        acc += x;
      }
      if (spec.op == ReduceOp::kMin) best = std::min(best, v);
      if (spec.op == ReduceOp::kMax) best = std::max(best, v);
    }
    T want = static_cast<T>(acc);
    if (spec.op == ReduceOp::kMin || spec.op == ReduceOp::kMax) want = best;
    if (spec.op == ReduceOp::kAvg) want = static_cast<T>(static_cast<int64_t>(want) / n);
    const T got = Load<T>(out, i);
    if (got != want && ++failures <= 5) {
      ADD_FAILURE() << what << " element " << i << ": got " << +got << ", want " << +want;
    }
  }
  return failures;
}

int CheckReduction(const ReduceSpec& spec, const std::vector<Buffer>& inputs, const void* out,
                   size_t count, const std::string& what) {
  switch (spec.dtype) {
    case DataType::kInt32:
      return CheckIntReductionTyped<int32_t>(spec, inputs, out, count, what);
    case DataType::kInt64:
      return CheckIntReductionTyped<int64_t>(spec, inputs, out, count, what);
    case DataType::kUInt8:
      return CheckIntReductionTyped<uint8_t>(spec, inputs, out, count, what);
    default:
      return CheckFloatReduction(spec, inputs, out, count, what);
  }
}

std::vector<const void*> InputPointers(const std::vector<Buffer>& buffers) {
  std::vector<const void*> p;
  for (const Buffer& b : buffers) p.push_back(b.data());
  return p;
}
std::vector<void*> OutputPointers(std::vector<Buffer>& buffers) {
  std::vector<void*> p;
  for (Buffer& b : buffers) p.push_back(b.data());
  return p;
}

void RunReduce(Isa isa, const ReduceSpec& spec, const std::vector<const void*>& in,
               const std::vector<void*>& out, size_t count,
               size_t streaming_min_bytes = internal::kDefaultStreamingStoreMinBytes) {
  internal::ReduceWith({.isa = isa, .streaming_store_min_bytes = streaming_min_bytes}, spec,
                       in.data(), static_cast<int>(in.size()), out.data(),
                       static_cast<int>(out.size()), count);
}

ReduceSpec DefaultSpec(DataType t, ReduceOp op) {
  ReduceSpec spec;
  spec.dtype = t;
  spec.op = op;
  if (op == ReduceOp::kPremulSum) spec.premul_factor = IsFloatingPoint(t) ? 0.37 : 3.0;
  return spec;
}

// ---------------------------------------------------------------------------
// Conversions.

TEST(Conversions, HalfToFloatAllValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = internal::HalfToFloat(static_cast<uint16_t>(h));
    const double want = RefHalfToDouble(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      const uint32_t bits = std::bit_cast<uint32_t>(f);
      EXPECT_EQ(bits, ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    }
  }
}

void ExpectRounded(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what;
  } else {
    EXPECT_EQ(got, want) << what;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << what;
  }
}

TEST(Conversions, FloatToHalfAndBFloat16MatchReference) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  int failures = 0;
  // Every 997th float32 bit pattern: all exponents, signs, NaNs and subnormals.
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu && failures < 10; bits += 997) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    const double h = RefHalfToDouble(internal::FloatToHalf(f));
    const double b = RefBFloat16ToDouble(internal::FloatToBFloat16(f));
    const double want_h = RefRound(f, kHalf);
    const double want_b = RefRound(f, kBFloat);
    const bool ok_h = std::isnan(want_h) ? std::isnan(h)
                                         : (h == want_h && std::signbit(h) == std::signbit(want_h));
    const bool ok_b = std::isnan(want_b) ? std::isnan(b)
                                         : (b == want_b && std::signbit(b) == std::signbit(want_b));
    if (!ok_h || !ok_b) {
      ++failures;
      ADD_FAILURE() << "float bits " << std::hex << bits << ": half " << h << " want " << want_h
                    << ", bf16 " << b << " want " << want_b;
    }
  }
}

TEST(Conversions, ExactTiesRoundToEven) {
  // Midpoints between consecutive finite float16 values (exact in float32).
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const double lo = RefHalfToDouble(static_cast<uint16_t>(h));
    const double hi = RefHalfToDouble(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h % 2 == 0) ? h : h + 1;
    ASSERT_EQ(internal::FloatToHalf(mid), even) << h;
    ASSERT_EQ(internal::FloatToHalf(-mid), even | 0x8000) << h;
    ASSERT_EQ(internal::DoubleToHalf((lo + hi) / 2), even) << h;
  }
  // Midpoint above the largest float16 overflows (65504 is odd).
  EXPECT_EQ(internal::FloatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(internal::FloatToHalf(65519.996f), 0x7BFF);
  // bfloat16: the dropped half is exactly 0x8000.
  for (uint32_t b = 0; b < 0x7F7F; b += 3) {
    const float mid = std::bit_cast<float>((b << 16) | 0x8000u);
    const uint16_t even = static_cast<uint16_t>((b % 2 == 0) ? b : b + 1);
    ASSERT_EQ(internal::FloatToBFloat16(mid), even) << b;
    ASSERT_EQ(internal::DoubleToBFloat16(mid), even) << b;
  }
  EXPECT_EQ(internal::FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
}

TEST(Conversions, DoubleRoundsOnce) {
  // 1 + 2^-11 + 2^-40: just above a float16 tie. Through float32 it would
  // become the tie itself and round down to 1.
  EXPECT_EQ(internal::DoubleToHalf(1 + 0x1p-11 + 0x1p-40), RefHalfBits(1 + 0x1p-10));
  EXPECT_EQ(internal::DoubleToBFloat16(1 + 0x1p-8 + 0x1p-40), RefBFloat16Bits(1 + 0x1p-7));
  std::mt19937_64 rng(7);
  for (int k = 0; k < 200000; ++k) {
    const double d = std::ldexp(std::uniform_real_distribution<double>(-2, 2)(rng),
                                static_cast<int>(rng() % 300) - 150);
    ExpectRounded(RefHalfToDouble(internal::DoubleToHalf(d)), RefRound(d, kHalf), "half");
    ExpectRounded(RefBFloat16ToDouble(internal::DoubleToBFloat16(d)), RefRound(d, kBFloat), "bf16");
    if (HasFailure()) break;
  }
}

TEST(Conversions, NaNsStayQuietNaNsWithTheirPayload) {
  EXPECT_EQ(internal::FloatToHalf(std::bit_cast<float>(0x7F800001u)), 0x7E00);  // signalling
  EXPECT_EQ(internal::FloatToHalf(std::bit_cast<float>(0xFFC02000u)), 0xFE01);
  EXPECT_EQ(internal::FloatToBFloat16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(internal::FloatToBFloat16(std::bit_cast<float>(0xFFFFFFFFu)), 0xFFFF);
  EXPECT_EQ(internal::DoubleToHalf(std::numeric_limits<double>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(internal::DoubleToHalf(-INFINITY), 0xFC00);
  EXPECT_EQ(internal::DoubleToBFloat16(INFINITY), 0x7F80);
  EXPECT_EQ(std::bit_cast<uint32_t>(internal::HalfToFloat(0x7C01)), 0x7FC02000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(internal::BFloat16ToFloat(0xFF81)), 0xFF810000u);
}

// ---------------------------------------------------------------------------
// Reduce: every dtype x op x kernel set.

class ReduceAllTest : public ::testing::TestWithParam<std::tuple<DataType, ReduceOp, Isa>> {};

TEST_P(ReduceAllTest, MatchesReference) {
  const auto [dtype, op, isa] = GetParam();
  SKIP_IF_UNSUPPORTED(isa);
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 100 + static_cast<uint64_t>(op));
  const ReduceSpec spec = DefaultSpec(dtype, op);
  for (int n : kInputCounts) {
    for (size_t count : kCounts) {
      std::vector<Buffer> inputs;
      for (int r = 0; r < n; ++r) {
        inputs.emplace_back(dtype, count);
        FillRandom(inputs.back(), op, rng);
      }
      std::vector<Buffer> outputs(3, Buffer(dtype, count));
      RunReduce(isa, spec, InputPointers(inputs), OutputPointers(outputs), count);
      const std::string what = std::string(DataTypeName(dtype)) + " " +
                               std::string(ReduceOpName(op)) + " n=" + std::to_string(n) +
                               " count=" + std::to_string(count);
      ASSERT_EQ(CheckReduction(spec, inputs, outputs[0].data(), count, what), 0);
      const size_t bytes = count * DataTypeSize(dtype);
      for (size_t j = 1; j < outputs.size(); ++j) {
        ASSERT_EQ(std::memcmp(outputs[0].data(), outputs[j].data(), bytes), 0) << what;
      }
    }
  }
}

TEST_P(ReduceAllTest, InPlace) {
  const auto [dtype, op, isa] = GetParam();
  SKIP_IF_UNSUPPORTED(isa);
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 1000 + static_cast<uint64_t>(op));
  const ReduceSpec spec = DefaultSpec(dtype, op);
  for (int n : {1, 2, 4, 7}) {
    for (size_t count : {size_t{33}, size_t{4097}}) {
      std::vector<Buffer> originals;
      for (int r = 0; r < n; ++r) {
        originals.emplace_back(dtype, count);
        FillRandom(originals.back(), op, rng);
      }
      // Every rank's buffer is both an input and an output (the local
      // all-reduce), plus one extra output.
      std::vector<Buffer> buffers = originals;
      buffers.emplace_back(dtype, count);
      std::vector<void*> out = OutputPointers(buffers);
      std::vector<const void*> in(out.begin(), out.begin() + n);
      RunReduce(isa, spec, in, out, count);
      for (size_t j = 0; j < buffers.size(); ++j) {
        const std::string what =
            std::string(DataTypeName(dtype)) + " " + std::string(ReduceOpName(op)) +
            " in place n=" + std::to_string(n) + " output " + std::to_string(j);
        ASSERT_EQ(CheckReduction(spec, originals, buffers[j].data(), count, what), 0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesOpsIsas, ReduceAllTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllOps),
                                            ::testing::Values(Isa::kScalar, Isa::kAvx2)),
                         [](const ::testing::TestParamInfo<ReduceAllTest::ParamType>& info) {
                           return std::string(DataTypeName(std::get<0>(info.param))) + "_" +
                                  std::string(ReduceOpName(std::get<1>(info.param))) + "_" +
                                  IsaName(std::get<2>(info.param));
                         });

// ---------------------------------------------------------------------------
// Floating-point specifics, per kernel set.

class ReduceFloatTest : public ::testing::TestWithParam<Isa> {};

TEST_P(ReduceFloatTest, PreAndPostDivide) {
  SKIP_IF_UNSUPPORTED(GetParam());
  struct Case {
    ReduceOp op;
    double premul, pre, post;
  };
  const Case cases[] = {
      {ReduceOp::kSum, 1, 2, 4},       {ReduceOp::kSum, 1, 3, 1},
      {ReduceOp::kSum, 1, 1, 3},       {ReduceOp::kAvg, 1, 2, 1},
      {ReduceOp::kAvg, 1, 1, 0.5},     {ReduceOp::kPremulSum, 0.3, 2, 1},
      {ReduceOp::kPremulSum, 5, 1, 7}, {ReduceOp::kMax, 1, 4, 1},
      {ReduceOp::kMin, 1, 3, 3},       {ReduceOp::kProduct, 1, 2, 2},
  };
  std::mt19937_64 rng(11);
  for (DataType dtype : kFloatTypes) {
    for (const Case& c : cases) {
      for (int n : {1, 3, 4, 7}) {
        const size_t count = 1031;
        std::vector<Buffer> inputs;
        for (int r = 0; r < n; ++r) {
          inputs.emplace_back(dtype, count);
          FillRandom(inputs.back(), c.op, rng);
        }
        ReduceSpec spec = DefaultSpec(dtype, c.op);
        spec.premul_factor = c.premul;
        spec.pre_divide = c.pre;
        spec.post_divide = c.post;
        std::vector<Buffer> outputs(2, Buffer(dtype, count));
        RunReduce(GetParam(), spec, InputPointers(inputs), OutputPointers(outputs), count);
        const std::string what = std::string(DataTypeName(dtype)) + " " +
                                 std::string(ReduceOpName(c.op)) + " pre=" + std::to_string(c.pre) +
                                 " post=" + std::to_string(c.post) + " n=" + std::to_string(n);
        ASSERT_EQ(CheckReduction(spec, inputs, outputs[1].data(), count, what), 0);
      }
    }
  }
}

// float32 buffers with a 16-bit wire type: each input rounded to the wire
// type, summed left to right in float32, the result (divided for kAvg)
// rounded to the wire type -- bit-exact.
TEST_P(ReduceFloatTest, WireTypeRoundsInputsAndResult) {
  SKIP_IF_UNSUPPORTED(GetParam());
  std::mt19937_64 rng(12);
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    const Format& f = wire == DataType::kBFloat16 ? kBFloat : kHalf;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      for (int n : kInputCounts) {
        for (size_t count : {size_t{1}, size_t{1023}, size_t{4097}}) {
          std::vector<Buffer> inputs;
          for (int r = 0; r < n; ++r) {
            inputs.emplace_back(DataType::kFloat32, count);
            for (size_t i = 0; i < count; ++i) {
              // Magnitudes up to 2^17 so float16 overflows sometimes.
              const double v = std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng),
                                          static_cast<int>(rng() % 40) - 22);
              StoreAt<float>(inputs.back().data(), i, static_cast<float>(v));
            }
          }
          ReduceSpec spec = DefaultSpec(DataType::kFloat32, op);
          spec.wire_dtype = wire;
          std::vector<Buffer> outputs(2, Buffer(DataType::kFloat32, count));
          RunReduce(GetParam(), spec, InputPointers(inputs), OutputPointers(outputs), count);
          for (size_t i = 0; i < count; ++i) {
            float acc = 0;
            for (int r = 0; r < n; ++r) {
              const float x = static_cast<float>(RefRound(Load<float>(inputs[r].data(), i), f));
              if (r == 0) {
                acc = x;
              } else if (op == ReduceOp::kMax) {
                acc = std::max(acc, x);
              } else {
                acc += x;
              }
            }
            if (op == ReduceOp::kAvg) acc /= static_cast<float>(n);
            const float want = static_cast<float>(RefRound(acc, f));
            for (int j = 0; j < 2; ++j) {
              const float got = Load<float>(outputs[j].data(), i);
              if (std::isnan(want)) {
                ASSERT_TRUE(std::isnan(got));
                continue;
              }
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << DataTypeName(wire) << " " << ReduceOpName(op) << " n=" << n << " i=" << i
                  << ": got " << got << " want " << want;
            }
          }
        }
      }
    }
  }
}

// Runs one element-wise reduction of the given values (one element per input)
// in a buffer of 67 elements (vector steps and tail), returning element 40.
double ReduceValues(Isa isa, const ReduceSpec& spec, const std::vector<double>& values) {
  const size_t count = 67;
  std::vector<Buffer> inputs;
  for (double v : values) {
    inputs.emplace_back(spec.dtype, count);
    for (size_t i = 0; i < count; ++i) SetDouble(spec.dtype, inputs.back().data(), i, v);
  }
  std::vector<Buffer> outputs(1, Buffer(spec.dtype, count));
  RunReduce(isa, spec, InputPointers(inputs), OutputPointers(outputs), count);
  const double first = GetDouble(spec.dtype, outputs[0].data(), 0);
  for (size_t i = 1; i < count; ++i) {
    const double v = GetDouble(spec.dtype, outputs[0].data(), i);
    EXPECT_TRUE(v == first || (std::isnan(v) && std::isnan(first))) << i;
  }
  return GetDouble(spec.dtype, outputs[0].data(), 40);
}

TEST_P(ReduceFloatTest, Float16OverflowsToInfinity) {
  SKIP_IF_UNSUPPORTED(GetParam());
  const ReduceSpec sum = DefaultSpec(DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(ReduceValues(GetParam(), sum, {60000, 60000}), INFINITY);
  EXPECT_EQ(ReduceValues(GetParam(), sum, {-60000, -60000}), -INFINITY);
  EXPECT_EQ(ReduceValues(GetParam(), sum, {65504, 16}), INFINITY);  // tie at the top: rounds up
  EXPECT_EQ(ReduceValues(GetParam(), sum, {65504, 15}), 65504);
  EXPECT_EQ(ReduceValues(GetParam(), sum, {65504, 65504, -65504}), 65504);  // float32 accumulator
  EXPECT_EQ(
      ReduceValues(GetParam(), DefaultSpec(DataType::kFloat16, ReduceOp::kProduct), {256, 256}),
      INFINITY);
  ReduceSpec avg = DefaultSpec(DataType::kFloat16, ReduceOp::kAvg);
  EXPECT_EQ(ReduceValues(GetParam(), avg, {60000, 60000}), 60000);  // no intermediate overflow
  const ReduceSpec bf16 = DefaultSpec(DataType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(ReduceValues(GetParam(), bf16, {0x1.FEp127, 0x1.FEp127}), INFINITY);
  // Subnormal sums stay exact.
  EXPECT_EQ(ReduceValues(GetParam(), sum, {0x1p-24, 0x1p-24, 0x1p-24}), 0x3p-24);
}

TEST_P(ReduceFloatTest, NaNPropagates) {
  SKIP_IF_UNSUPPORTED(GetParam());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DataType dtype : kFloatTypes) {
    for (ReduceOp op : kAllOps) {
      const ReduceSpec spec = DefaultSpec(dtype, op);
      for (int position = 0; position < 4; ++position) {
        std::vector<double> values = {1, -2, 3, 0.5};
        values[position] = nan;
        EXPECT_TRUE(std::isnan(ReduceValues(GetParam(), spec, values)))
            << DataTypeName(dtype) << " " << ReduceOpName(op) << " NaN at " << position;
      }
    }
    EXPECT_TRUE(std::isnan(
        ReduceValues(GetParam(), DefaultSpec(dtype, ReduceOp::kSum), {INFINITY, -INFINITY})));
    EXPECT_EQ(ReduceValues(GetParam(), DefaultSpec(dtype, ReduceOp::kMax), {-INFINITY, 2, 1}), 2);
    EXPECT_EQ(ReduceValues(GetParam(), DefaultSpec(dtype, ReduceOp::kMin), {INFINITY, 2, 1}), 1);
  }
}

TEST_P(ReduceFloatTest, ResultTiesRoundToEven) {
  SKIP_IF_UNSUPPORTED(GetParam());
  const ReduceSpec bf16 = DefaultSpec(DataType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(ReduceValues(GetParam(), bf16, {1, 0x1p-8}), 1);                    // to even: down
  EXPECT_EQ(ReduceValues(GetParam(), bf16, {1 + 0x1p-7, 0x1p-8}), 1 + 0x1p-6);  // to even: up
  EXPECT_EQ(ReduceValues(GetParam(), bf16, {-1 - 0x1p-7, -0x1p-8}), -1 - 0x1p-6);
  EXPECT_EQ(ReduceValues(GetParam(), bf16, {1, 0x1p-8, 0x1p-20}), 1 + 0x1p-7);  // above tie
  const ReduceSpec half = DefaultSpec(DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(ReduceValues(GetParam(), half, {1, 0x1p-11}), 1);
  EXPECT_EQ(ReduceValues(GetParam(), half, {1 + 0x1p-10, 0x1p-11}), 1 + 0x1p-9);
  EXPECT_EQ(ReduceValues(GetParam(), half, {1, 0x1p-11, 0x1p-20}), 1 + 0x1p-10);
  // Subnormal float16 tie: (2^-24 + 2^-24*2) / 2 = 1.5 * 2^-24 -> 2 * 2^-24.
  ReduceSpec avg = DefaultSpec(DataType::kFloat16, ReduceOp::kAvg);
  EXPECT_EQ(ReduceValues(GetParam(), avg, {0x1p-24, 0x2p-24}), 0x2p-24);
  // float32 buffers, wire bfloat16: each input rounds on its own.
  ReduceSpec wire = DefaultSpec(DataType::kFloat32, ReduceOp::kSum);
  wire.wire_dtype = DataType::kBFloat16;
  EXPECT_EQ(ReduceValues(GetParam(), wire, {1 + 0x1p-8, 1 + 0x1p-8}), 2);
  EXPECT_EQ(ReduceValues(GetParam(), wire, {1 + 0x3p-8, 0}), 1 + 0x1p-6);
}

TEST_P(ReduceFloatTest, MinMaxKeepSignedZerosInInputOrder) {
  SKIP_IF_UNSUPPORTED(GetParam());
  for (DataType dtype : kFloatTypes) {
    const double max_zero =
        ReduceValues(GetParam(), DefaultSpec(dtype, ReduceOp::kMax), {-0.0, 0.0});
    EXPECT_TRUE(max_zero == 0 && std::signbit(max_zero)) << DataTypeName(dtype);
    const double min_zero =
        ReduceValues(GetParam(), DefaultSpec(dtype, ReduceOp::kMin), {0.0, -0.0});
    EXPECT_TRUE(min_zero == 0 && !std::signbit(min_zero)) << DataTypeName(dtype);
  }
}

TEST_P(ReduceFloatTest, Float64WireAndFloat64WithNarrowWire) {
  SKIP_IF_UNSUPPORTED(GetParam());
  // float32 buffers, wire float64: float64 accumulation, one final rounding.
  ReduceSpec spec = DefaultSpec(DataType::kFloat32, ReduceOp::kSum);
  spec.wire_dtype = DataType::kFloat64;
  EXPECT_EQ(ReduceValues(GetParam(), spec, {1, 0x1p-24, 0x1p-24}), 1 + 0x1p-23);
  spec.wire_dtype = DataType::kInvalid;  // float32 accumulation: 1 + 2^-24 rounds to 1 twice
  EXPECT_EQ(ReduceValues(GetParam(), spec, {1, 0x1p-24, 0x1p-24}), 1);
  // float64 buffers, wire bfloat16.
  ReduceSpec f64 = DefaultSpec(DataType::kFloat64, ReduceOp::kSum);
  f64.wire_dtype = DataType::kBFloat16;
  EXPECT_EQ(ReduceValues(GetParam(), f64, {1 + 0x1p-9, 1 + 0x1p-9, 1 + 0x1p-9}), 3);
  f64.wire_dtype = DataType::kFloat16;
  EXPECT_EQ(ReduceValues(GetParam(), f64, {1 + 0x1p-11 + 0x1p-40, 0}), 1 + 0x1p-10);
}

INSTANTIATE_TEST_SUITE_P(Isas, ReduceFloatTest, ::testing::Values(Isa::kScalar, Isa::kAvx2),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return IsaName(info.param);
                         });

// ---------------------------------------------------------------------------
// The kernel sets agree bit for bit (up to NaN payloads), on special values,
// every plan shape, streaming stores and unaligned buffers.

// Element-wise bit equality, except that any two NaNs match: when several NaNs
// meet in an addition or multiplication, which payload survives depends on
// operand order, which the compiler may swap.
bool SameBitsOrBothNaN(DataType t, const void* a, const void* b, size_t count) {
  const size_t size = DataTypeSize(t);
  for (size_t i = 0; i < count; ++i) {
    const char* pa = static_cast<const char*>(a) + i * size;
    const char* pb = static_cast<const char*>(b) + i * size;
    if (std::memcmp(pa, pb, size) == 0) continue;
    if (IsFloatingPoint(t) && std::isnan(GetDouble(t, a, i)) && std::isnan(GetDouble(t, b, i))) {
      continue;
    }
    ADD_FAILURE() << "element " << i << ": " << GetDouble(t, a, i) << " vs " << GetDouble(t, b, i);
    return false;
  }
  return true;
}

TEST(ReduceIsas, ScalarAndAvx2AreBitIdentical) {
  if (!HaveAvx2()) GTEST_SKIP() << "no AVX2/F16C";
  std::mt19937_64 rng(13);
  const DataType wires[] = {DataType::kInvalid, DataType::kFloat32, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kFloat64};
  struct Scales {
    double premul, pre, post;
  };
  const Scales scales[] = {{1, 1, 1}, {0.3, 2, 1}, {1, 3, 5}, {3, 1, 0.25}};
  const size_t count = 1000;
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (DataType wire : wires) {
        for (const Scales& s : scales) {
          if (!IsFloatingPoint(dtype) &&
              (wire != DataType::kInvalid || s.pre != 1 || s.post != 1)) {
            continue;
          }
          for (int n : {1, 2, 5}) {
            std::vector<Buffer> inputs;
            for (int r = 0; r < n; ++r) {
              inputs.emplace_back(dtype, count + 8);
              // Random bit patterns: NaNs, infinities, subnormals, zeros.
              for (size_t i = 0; i < inputs.back().size_bytes(); ++i) {
                inputs.back().data()[i] = static_cast<uint8_t>(rng());
              }
            }
            ReduceSpec spec = DefaultSpec(dtype, op);
            spec.wire_dtype = wire;
            if (IsFloatingPoint(dtype)) {
              spec.premul_factor = s.premul;
              spec.pre_divide = s.pre;
              spec.post_divide = s.post;
            }
            for (size_t offset : {size_t{0}, size_t{1}, size_t{3}}) {
              for (size_t streaming : {size_t{0}, size_t{1} << 40}) {
                std::vector<Buffer> a(2, Buffer(dtype, count + 8));
                std::vector<Buffer> b(2, Buffer(dtype, count + 8));
                const size_t bytes_offset = offset * DataTypeSize(dtype);
                std::vector<const void*> in;
                for (Buffer& x : inputs) in.push_back(x.data() + bytes_offset);
                std::vector<void*> out_a, out_b;
                for (int j = 0; j < 2; ++j) {
                  out_a.push_back(a[j].data() + bytes_offset);
                  out_b.push_back(b[j].data() + bytes_offset);
                }
                RunReduce(Isa::kScalar, spec, in, out_a, count);
                RunReduce(Isa::kAvx2, spec, in, out_b, count, streaming);
                for (int j = 0; j < 2; ++j) {
                  ASSERT_TRUE(SameBitsOrBothNaN(dtype, out_a[j], out_b[j], count))
                      << DataTypeName(dtype) << " " << ReduceOpName(op) << " wire "
                      << static_cast<int>(wire) << " premul " << s.premul << " pre " << s.pre
                      << " post " << s.post << " n=" << n << " offset " << offset << " streaming "
                      << streaming;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(ReduceIsas, StreamingStoresWithDifferentlyAlignedOutputs) {
  if (!HaveAvx2()) GTEST_SKIP() << "no AVX2/F16C";
  const size_t count = 3000;
  std::mt19937_64 rng(14);
  for (DataType dtype : kFloatTypes) {
    std::vector<Buffer> inputs;
    for (int r = 0; r < 3; ++r) {
      inputs.emplace_back(dtype, count);
      FillRandom(inputs.back(), ReduceOp::kSum, rng);
    }
    const ReduceSpec spec = DefaultSpec(dtype, ReduceOp::kSum);
    std::vector<Buffer> outputs(3, Buffer(dtype, count + 8));
    std::vector<void*> out;
    for (size_t j = 0; j < outputs.size(); ++j) {
      out.push_back(outputs[j].data() + j * DataTypeSize(dtype));
    }
    RunReduce(Isa::kAvx2, spec, InputPointers(inputs), out, count, 0);
    for (size_t j = 0; j < out.size(); ++j) {
      ASSERT_EQ(CheckReduction(spec, inputs, out[j], count, std::string(DataTypeName(dtype))), 0);
    }
  }
}

// ---------------------------------------------------------------------------
// Integers.

TEST(ReduceIntegers, WrapAndTruncate) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2}) {
    if (isa == Isa::kAvx2 && !HaveAvx2()) continue;
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kInt32, ReduceOp::kSum), {2147483647.0, 1}),
              -2147483648.0);
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kUInt8, ReduceOp::kSum), {200, 100}), 44);
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kUInt8, ReduceOp::kProduct), {16, 17}), 16);
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kInt32, ReduceOp::kAvg), {-7, 0}), -3);
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kInt32, ReduceOp::kAvg), {7, 0, 1}), 2);
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kUInt8, ReduceOp::kMax), {200, 100}), 200);
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kInt64, ReduceOp::kMin), {-5, 3}), -5);
    EXPECT_EQ(ReduceValues(isa, DefaultSpec(DataType::kInt64, ReduceOp::kPremulSum), {-5, 3}), -6);
  }
}

TEST(Reduce, EmptyCallsDoNothing) {
  float in = 1, out = 7;
  const void* ins[] = {&in};
  void* outs[] = {&out};
  Reduce(ReduceSpec{}, ins, 1, outs, 1, 0);
  Reduce(ReduceSpec{}, ins, 1, outs, 0, 1);
  EXPECT_EQ(out, 7);
  Reduce(ReduceSpec{}, ins, 1, outs, 1, 1);
  EXPECT_EQ(out, 1);
}

// ---------------------------------------------------------------------------
// Cast.

class CastTest : public ::testing::TestWithParam<Isa> {};

void RunCast(Isa isa, DataType from, const void* in, DataType to, void* out, size_t count) {
  internal::CastWith({.isa = isa}, from, in, to, out, count);
}

bool Signed(DataType t) { return t != DataType::kUInt8; }

TEST_P(CastTest, AllPairsOfRepresentableValues) {
  SKIP_IF_UNSUPPORTED(GetParam());
  const double unsigned_values[] = {0, 1, 2, 3, 7, 100, 127, 128, 200, 255};
  const double signed_values[] = {-1, -2, -100, -128};
  for (DataType from : kAllTypes) {
    for (DataType to : kAllTypes) {
      std::vector<double> values(std::begin(unsigned_values), std::end(unsigned_values));
      if (Signed(from) && Signed(to)) {
        values.insert(values.end(), std::begin(signed_values), std::end(signed_values));
      }
      if (IsFloatingPoint(from) && IsFloatingPoint(to)) {
        values.insert(values.end(), {0.5, -0.375, 0x1p-14, 57344, -INFINITY, INFINITY});
      }
      // Repeat to cover vector steps and tails.
      const size_t count = values.size() * 5 + 3;
      Buffer in(from, count), out(to, count);
      for (size_t i = 0; i < count; ++i) SetDouble(from, in.data(), i, values[i % values.size()]);
      RunCast(GetParam(), from, in.data(), to, out.data(), count);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(GetDouble(to, out.data(), i), values[i % values.size()])
            << DataTypeName(from) << " -> " << DataTypeName(to) << " element " << i;
      }
    }
  }
}

TEST_P(CastTest, RoundingSaturationAndWrapping) {
  SKIP_IF_UNSUPPORTED(GetParam());
  const Isa isa = GetParam();
  auto cast_one = [&](DataType from, double v, DataType to) {
    // 19 copies: vector path plus tail.
    Buffer in(from, 19), out(to, 19);
    for (size_t i = 0; i < 19; ++i) SetDouble(from, in.data(), i, v);
    RunCast(isa, from, in.data(), to, out.data(), 19);
    return GetDouble(to, out.data(), 18);
  };
  // float -> int: truncation toward zero, saturation, NaN -> 0.
  EXPECT_EQ(cast_one(DataType::kFloat32, 2.75, DataType::kInt32), 2);
  EXPECT_EQ(cast_one(DataType::kFloat32, -2.75, DataType::kInt32), -2);
  EXPECT_EQ(cast_one(DataType::kFloat64, 1e10, DataType::kInt32), 2147483647);
  EXPECT_EQ(cast_one(DataType::kFloat64, -1e10, DataType::kInt32), -2147483648.0);
  EXPECT_EQ(cast_one(DataType::kFloat32, 1e30, DataType::kInt64), 0x1p63);  // INT64_MAX as double
  EXPECT_EQ(cast_one(DataType::kFloat16, 300, DataType::kUInt8), 255);
  EXPECT_EQ(cast_one(DataType::kBFloat16, -5, DataType::kUInt8), 0);
  EXPECT_EQ(cast_one(DataType::kFloat32, -0.5, DataType::kUInt8), 0);
  EXPECT_EQ(cast_one(DataType::kFloat16, INFINITY, DataType::kInt32), 2147483647);
  EXPECT_EQ(
      cast_one(DataType::kFloat64, std::numeric_limits<double>::quiet_NaN(), DataType::kInt64), 0);
  // float -> narrower float: round to nearest even, overflow to inf.
  EXPECT_EQ(cast_one(DataType::kFloat32, 1 + 0x1p-11, DataType::kFloat16), 1);
  EXPECT_EQ(cast_one(DataType::kFloat32, 1 + 0x3p-11, DataType::kFloat16), 1 + 0x1p-9);
  EXPECT_EQ(cast_one(DataType::kFloat32, 1 + 0x1p-8, DataType::kBFloat16), 1);
  EXPECT_EQ(cast_one(DataType::kFloat32, 1e6, DataType::kFloat16), INFINITY);
  EXPECT_EQ(cast_one(DataType::kFloat64, 1e300, DataType::kFloat32), INFINITY);
  EXPECT_EQ(cast_one(DataType::kFloat64, 1 + 0x1p-11 + 0x1p-40, DataType::kFloat16), 1 + 0x1p-10);
  EXPECT_EQ(cast_one(DataType::kBFloat16, 1 + 0x1p-7, DataType::kFloat16), 1 + 0x1p-7);
  EXPECT_EQ(cast_one(DataType::kFloat16, 0x1p-24, DataType::kBFloat16), 0x1p-24);
  EXPECT_EQ(cast_one(DataType::kFloat16, 1 + 0x3p-10, DataType::kBFloat16), 1);  // 0.375 ulp
  // int -> float: one rounding to nearest even.
  EXPECT_EQ(cast_one(DataType::kInt32, 16777217, DataType::kFloat32), 16777216);
  EXPECT_EQ(cast_one(DataType::kInt32, 2049, DataType::kFloat16), 2048);
  EXPECT_EQ(cast_one(DataType::kInt32, 2051, DataType::kFloat16), 2052);
  EXPECT_EQ(cast_one(DataType::kInt32, 100000, DataType::kFloat16), INFINITY);
  EXPECT_EQ(cast_one(DataType::kInt32, -257, DataType::kBFloat16), -256);
  // int -> int: two's complement wrap.
  EXPECT_EQ(cast_one(DataType::kInt32, -1, DataType::kUInt8), 255);
  EXPECT_EQ(cast_one(DataType::kInt32, 300, DataType::kUInt8), 44);
  EXPECT_EQ(cast_one(DataType::kUInt8, 200, DataType::kInt64), 200);

  // int64 -> bfloat16 with a value that double rounding would get wrong:
  // 2^60 + 2^52 + 1 is just above a bfloat16 tie; through float64 it becomes
  // the tie and rounds down to 2^60.
  const int64_t big = (int64_t{1} << 60) + (int64_t{1} << 52) + 1;
  int64_t ins[19];
  std::fill(std::begin(ins), std::end(ins), big);
  uint16_t outs[19];
  RunCast(isa, DataType::kInt64, ins, DataType::kBFloat16, outs, 19);
  EXPECT_EQ(RefBFloat16ToDouble(outs[18]), 0x1p60 + 0x1p53);
  float outs_f32[19];
  RunCast(isa, DataType::kInt64, ins, DataType::kFloat32, outs_f32, 19);
  EXPECT_EQ(outs_f32[18], 0x1p60f + 0x1p52f);  // float32 ulp there is 2^37
  std::fill(std::begin(ins), std::end(ins), std::numeric_limits<int64_t>::min());
  RunCast(isa, DataType::kInt64, ins, DataType::kFloat16, outs, 19);
  EXPECT_EQ(RefHalfToDouble(outs[18]), -INFINITY);
  int32_t narrow[19];
  std::fill(std::begin(ins), std::end(ins), (int64_t{1} << 32) + 5);
  RunCast(isa, DataType::kInt64, ins, DataType::kInt32, narrow, 19);
  EXPECT_EQ(narrow[18], 5);
}

TEST_P(CastTest, MatchesScalarConversionsBitForBit) {
  SKIP_IF_UNSUPPORTED(GetParam());
  std::mt19937_64 rng(15);
  const size_t count = 100003;
  std::vector<uint32_t> bits(count);
  for (uint32_t& b : bits) b = static_cast<uint32_t>(rng());
  std::vector<uint16_t> half(count), bf16(count);
  RunCast(GetParam(), DataType::kFloat32, bits.data(), DataType::kFloat16, half.data(), count);
  RunCast(GetParam(), DataType::kFloat32, bits.data(), DataType::kBFloat16, bf16.data(), count);
  for (size_t i = 0; i < count; ++i) {
    const float f = std::bit_cast<float>(bits[i]);
    ASSERT_EQ(half[i], internal::FloatToHalf(f)) << std::hex << bits[i];
    ASSERT_EQ(bf16[i], internal::FloatToBFloat16(f)) << std::hex << bits[i];
  }
  std::vector<float> back(count);
  RunCast(GetParam(), DataType::kFloat16, half.data(), DataType::kFloat32, back.data(), count);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]),
              std::bit_cast<uint32_t>(internal::HalfToFloat(half[i])));
  }
  RunCast(GetParam(), DataType::kBFloat16, bf16.data(), DataType::kFloat32, back.data(), count);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), uint32_t{bf16[i]} << 16);
  }
  // float16 <-> bfloat16 round through float32 exactly once.
  std::vector<uint16_t> cross(count);
  RunCast(GetParam(), DataType::kFloat16, half.data(), DataType::kBFloat16, cross.data(), count);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(cross[i], internal::FloatToBFloat16(internal::HalfToFloat(half[i])));
  }
}

TEST_P(CastTest, SameTypeCopiesAndInPlace) {
  SKIP_IF_UNSUPPORTED(GetParam());
  std::vector<float> a = {1.5f, -2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  std::vector<float> b(a.size());
  RunCast(GetParam(), DataType::kFloat32, a.data(), DataType::kFloat32, b.data(), a.size());
  EXPECT_EQ(a, b);
  // Same-size types in place: float32 -> int32.
  RunCast(GetParam(), DataType::kFloat32, a.data(), DataType::kInt32, a.data(), a.size());
  std::vector<int32_t> ints(a.size());
  std::memcpy(ints.data(), a.data(), a.size() * 4);
  EXPECT_EQ(ints[0], 1);
  EXPECT_EQ(ints[1], -2);
  EXPECT_EQ(ints[10], 11);
}

INSTANTIATE_TEST_SUITE_P(Isas, CastTest, ::testing::Values(Isa::kScalar, Isa::kAvx2),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return IsaName(info.param);
                         });

}  // namespace
}  // namespace hsdp::cpu
