// FakeDeviceApi's kernels (see fake_device_api.h): copies, the fused
// scale/cast, the intra-device reduction, and the run-time operand check that
// makes a kernel on freed or unmapped memory a sticky illegal-address fault.
// Every kernel runs on its stream's thread, in stream order, and checks its
// operands when it runs, not when it is enqueued.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/device/fake_device_api.h"
#include "daemon/device/intra_device_reduce.h"
#include "hsdp/kernels/reduce_kernels.h"
#include "hsdp/common/status_macros.h"

namespace hsdp::device {

bool FakeDeviceApi::Accessible(DevicePtr ptr, uint64_t bytes) const {
  std::lock_guard<std::mutex> l(mu_);
  auto inside = [&](DevicePtr base, uint64_t len) {
    return ptr >= base && bytes <= len && ptr - base <= len - bytes;
  };
  if (auto it = allocations_.upper_bound(ptr); it != allocations_.begin()) {
    --it;
    if (inside(it->first, it->second.bytes)) return true;
  }
  if (auto it = foreign_.upper_bound(ptr); it != foreign_.begin()) {
    --it;
    if (inside(it->first, it->second)) return true;
  }
  for (const auto& [token, m] : mappings_) {
    if (inside(m.ptr, m.bytes)) return true;
  }
  return false;
}

absl::Status FakeDeviceApi::CheckAccess(DevicePtr ptr, uint64_t bytes, const std::string& what) {
  if (bytes == 0 || Accessible(ptr, bytes)) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, " touched [", ptr, ", +", bytes,
                                       "), which is neither allocated nor mapped any more");
  ReportFault(msg);
  return absl::InternalError(absl::StrCat("illegal address: ", msg));
}

void FakeDeviceApi::ReportFault(const std::string& what) {
  std::lock_guard<std::mutex> l(mu_);
  if (faults_++ == 0) first_fault_ = what;
}

int FakeDeviceApi::faults() const {
  std::lock_guard<std::mutex> l(mu_);
  return faults_;
}

std::string FakeDeviceApi::first_fault() const {
  std::lock_guard<std::mutex> l(mu_);
  return first_fault_;
}

absl::Status FakeDeviceApi::MemcpyAsync(DevicePtr dst, DevicePtr src, uint64_t bytes,
                                        StreamHandle stream) {
  std::shared_ptr<Stream> s = FindStream(stream);
  if (s == nullptr) return absl::NotFoundError("memcpy: unknown stream");
  if (!InArena(dst, bytes) || !InArena(src, bytes)) {
    return absl::InvalidArgumentError("memcpy: range outside every fake device");
  }
  return EnqueueHostFn(stream, [=, this]() {
    RETURN_IF_ERROR(CheckAccess(src, bytes, "memcpy (source)"));
    RETURN_IF_ERROR(CheckAccess(dst, bytes, "memcpy (destination)"));
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    return absl::OkStatus();
  });
}

absl::Status FakeDeviceApi::ScaleCastAsync(DevicePtr src, DataType from, DevicePtr dst,
                                           DataType to, uint64_t count, double scale,
                                           StreamHandle stream) {
  std::shared_ptr<Stream> s = FindStream(stream);
  if (s == nullptr) return absl::NotFoundError("scale/cast: unknown stream");
  if (!IsFloatingPoint(from) || !IsFloatingPoint(to)) {
    return absl::InvalidArgumentError("scale/cast: float types only");
  }
  if (!InArena(src, count * DataTypeSize(from)) || !InArena(dst, count * DataTypeSize(to))) {
    return absl::InvalidArgumentError("scale/cast: range outside every fake device");
  }
  return EnqueueHostFn(stream, [=, this]() {
    RETURN_IF_ERROR(CheckAccess(src, count * DataTypeSize(from), "scale/cast kernel (source)"));
    RETURN_IF_ERROR(CheckAccess(dst, count * DataTypeSize(to), "scale/cast kernel (destination)"));
    // Through float64: one scaling, then one rounding to `to`.
    std::vector<double> tmp(count);
    cpu::Cast(from, reinterpret_cast<const void*>(src), DataType::kFloat64, tmp.data(), count);
    if (scale != 1.0) {
      for (double& v : tmp) v *= scale;
    }
    cpu::Cast(DataType::kFloat64, tmp.data(), to, reinterpret_cast<void*>(dst), count);
    return absl::OkStatus();
  });
}

absl::Status FakeDeviceApi::ReduceAsync(const std::vector<DevicePtr>& srcs, DataType from,
                                        DevicePtr dst, DataType to, uint64_t count, ReduceOp op,
                                        double scale, bool accumulate, StreamHandle stream) {
  std::shared_ptr<Stream> s = FindStream(stream);
  if (s == nullptr) return absl::NotFoundError("reduce: unknown stream");
  RETURN_IF_ERROR(CheckReduceArgs(srcs.size(), op, from, to, scale != 1.0));
  const bool same = from == to && scale == 1.0;
  const size_t in_bytes = count * DataTypeSize(from), out_bytes = count * DataTypeSize(to);
  for (DevicePtr p : srcs) {
    if (!InArena(p, in_bytes)) return absl::InvalidArgumentError("reduce: input outside every fake device");
  }
  if (!InArena(dst, out_bytes)) return absl::InvalidArgumentError("reduce: output outside every fake device");
  if (srcs.size() > static_cast<size_t>(kMaxReduceInputs)) {
    // As the CUDA kernel does: passes of at most kMaxReduceInputs inputs,
    // each later one folding into dst (so an input that is dst must come in
    // the first pass: InputsDstFirst).
    const std::vector<DevicePtr> ordered = InputsDstFirst(srcs, dst);
    for (size_t k = 0; k < ordered.size(); k += kMaxReduceInputs) {
      const size_t n = std::min<size_t>(kMaxReduceInputs, ordered.size() - k);
      std::vector<DevicePtr> pass(ordered.begin() + k, ordered.begin() + k + n);
      RETURN_IF_ERROR(ReduceAsync(pass, from, dst, to, count, op, scale, accumulate || k > 0, stream));
    }
    return absl::OkStatus();
  }
  return EnqueueHostFn(stream, [=, this]() -> absl::Status {
    for (DevicePtr p : srcs) RETURN_IF_ERROR(CheckAccess(p, in_bytes, "reduce kernel (input)"));
    RETURN_IF_ERROR(CheckAccess(dst, out_bytes, "reduce kernel (output)"));
    if (count == 0) return absl::OkStatus();
    if (same) {  // the CPU kernels, in the type itself (integers wrap as there)
      std::vector<const void*> ins;
      if (accumulate) ins.push_back(reinterpret_cast<const void*>(dst));
      for (DevicePtr p : srcs) ins.push_back(reinterpret_cast<const void*>(p));
      ReduceSpec spec;
      spec.dtype = from;
      spec.op = op;
      void* out = reinterpret_cast<void*>(dst);
      cpu::Reduce(spec, ins.data(), static_cast<int>(ins.size()), &out, 1, count);
      return absl::OkStatus();
    }
    // Through float64: scale each input, combine, one rounding to `to`.
    std::vector<double> acc(count), in(count);
    bool first = true;
    auto combine = [&](const std::vector<double>& x) {
      for (uint64_t i = 0; i < count; ++i) {
        double& a = acc[i];
        if (first) { a = x[i]; continue; }
        switch (op) {
          case ReduceOp::kSum: a += x[i]; break;
          case ReduceOp::kProduct: a *= x[i]; break;
          case ReduceOp::kMin: a = (std::isnan(a) || std::isnan(x[i])) ? NAN : std::min(a, x[i]); break;
          default: a = (std::isnan(a) || std::isnan(x[i])) ? NAN : std::max(a, x[i]); break;
        }
      }
      first = false;
    };
    if (accumulate) {
      cpu::Cast(to, reinterpret_cast<const void*>(dst), DataType::kFloat64, in.data(), count);
      combine(in);
    }
    for (DevicePtr p : srcs) {
      cpu::Cast(from, reinterpret_cast<const void*>(p), DataType::kFloat64, in.data(), count);
      if (scale != 1.0) {
        for (double& v : in) v *= scale;
      }
      combine(in);
    }
    cpu::Cast(DataType::kFloat64, acc.data(), to, reinterpret_cast<void*>(dst), count);
    return absl::OkStatus();
  });
}

}  // namespace hsdp::device
