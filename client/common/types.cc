#include "hsdp/types.h"

namespace hsdp {

std::string_view DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
    default: return "invalid";
  }
}

DataType ParseDataType(std::string_view n) {
  if (n == "float32" || n == "fp32" || n == "float") return DataType::kFloat32;
  if (n == "float16" || n == "fp16" || n == "half") return DataType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DataType::kBFloat16;
  if (n == "float64" || n == "fp64" || n == "double") return DataType::kFloat64;
  if (n == "int32" || n == "int") return DataType::kInt32;
  if (n == "int64" || n == "long") return DataType::kInt64;
  if (n == "uint8") return DataType::kUInt8;
  return DataType::kInvalid;
}

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kPremulSum: return "premul_sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
    default: return "invalid";
  }
}

ReduceOp ParseReduceOp(std::string_view n) {
  if (n == "sum") return ReduceOp::kSum;
  if (n == "avg") return ReduceOp::kAvg;
  if (n == "premul_sum") return ReduceOp::kPremulSum;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "product" || n == "prod") return ReduceOp::kProduct;
  return ReduceOp::kInvalid;
}

std::string_view CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
    case Collective::kReduceScatterAllReduce: return "reduce_scatter_all_reduce";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
    case Collective::kAllToAll: return "all_to_all";
    default: return "invalid";
  }
}

int DefaultPreDivideFactor(int world_size) {
  // SEMANTICS.md's worked examples (8 -> 2, 16 -> 4, 2 -> 1) all satisfy
  // world / f >= f, so that is the bound used here.
  int f = 1;
  while (world_size > 0 && world_size % (f * 2) == 0 && world_size / (f * 2) >= f * 2) f *= 2;
  return f;
}

}  // namespace hsdp
