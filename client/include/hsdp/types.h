// Public value types shared by the C++ client API and the shared-memory ABI.
// The numeric values of these enums are part of the data-plane ABI
// (proto/hsdp/shm/layout.h): never renumber, only append.
#ifndef HSDP_TYPES_H_
#define HSDP_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hsdp {

enum class DataType : uint8_t {
  kInvalid = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat64 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kUInt8 = 7,
};
inline constexpr uint8_t kMaxDataType = 7;

enum class ReduceOp : uint8_t {
  kInvalid = 0,
  kSum = 1,
  kAvg = 2,
  kPremulSum = 3,  // sum of (input * ReduceOptions::premul_factor)
  kMin = 4,
  kMax = 5,
  kProduct = 6,
};
inline constexpr uint8_t kMaxReduceOp = 6;

enum class Collective : uint8_t {
  kInvalid = 0,
  kAllReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kBroadcast = 4,
  kBarrier = 5,
  // HSDP gradient path as one submission: reduce-scatter in the shard group,
  // then all-reduce of the shard in the replicate group.
  kReduceScatterAllReduce = 6,
  // Point-to-point, matched per (group, source, destination, tag) in posting
  // order; a receive may name any source.
  kSend = 7,
  kRecv = 8,
  // Every rank sends a block to every rank: equal blocks of `count`
  // elements, or per-rank counts given in a splits buffer.
  kAllToAll = 9,
};
inline constexpr uint8_t kMaxCollective = 9;
// A receive from any source.
inline constexpr int kAnySource = -1;

// Size in bytes of one element; 0 for kInvalid or unknown values.
constexpr size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
    default: return 0;
  }
}
constexpr bool IsFloatingPoint(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16 ||
         t == DataType::kFloat64;
}

// Lower-case names: "float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8".
std::string_view DataTypeName(DataType t);
// Accepts the names above plus the aliases "fp32", "fp16", "half", "bf16", "fp64", "double",
// "float", "int", "long". Returns kInvalid for anything else.
DataType ParseDataType(std::string_view name);

// "sum", "avg", "premul_sum", "min", "max", "product".
std::string_view ReduceOpName(ReduceOp op);
ReduceOp ParseReduceOp(std::string_view name);

std::string_view CollectiveName(Collective c);

// How a reducing collective combines its inputs. Applied in this order, once:
//   x' = x / pre_divide (and * premul_factor for kPremulSum), cast to reduce_dtype,
//   reduce across ranks (16-bit floats accumulate in float32), then / post_divide
//   (and / group size for kAvg), cast back to the buffer dtype.
struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  double premul_factor = 1.0;
  double pre_divide = 1.0;
  double post_divide = 1.0;
  // kInvalid means "the buffer dtype". Otherwise a floating-point type used on the wire.
  DataType reduce_dtype = DataType::kInvalid;
};

// The power-of-two pre-divide rule (SEMANTICS.md): the largest power of two f with
// world % f == 0 and world / f >= f. world 8 -> 2, 16 -> 4, 2 -> 1.
int DefaultPreDivideFactor(int world_size);

}  // namespace hsdp

#endif  // HSDP_TYPES_H_
