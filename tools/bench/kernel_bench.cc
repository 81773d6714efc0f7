// Throughput of the CPU engine's reduce kernels next to memcpy, on one thread.
//
// For each buffer size (bytes per buffer) it times:
//   memcpy       one buffer into another (2 streams: 1 read, 1 write);
//   f32 sum      Reduce float32 kSum, 2 inputs -> 2 distinct outputs (4 streams);
//   f32 inplace  the same with outputs[j] == inputs[j];
//   bf16 sum     Reduce bfloat16 kSum, 2 -> 2 distinct outputs;
//   f32 wire16   float32 kSum with wire_dtype bfloat16, 2 -> 2 distinct outputs.
// GB/s counts every byte read or written (10^9 bytes/s); "x memcpy" is the
// kernel's time divided by memcpy's time for one buffer of the same size (4
// streams against 2: about 2 when both run at memory bandwidth).
//
// Usage: kernel_bench [--scalar] [--stream-min-bytes N] [--min-seconds S]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "hsdp/kernels/reduce_kernels.h"
#include "hsdp/kernels/reduce_kernels_internal.h"

namespace {

using hsdp::DataType;
using hsdp::ReduceOp;
using hsdp::cpu::ReduceSpec;
namespace internal = hsdp::cpu::internal;

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes)
      : data(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
};

// Fills with small finite values valid as float32 and as bfloat16 pairs.
void Fill(char* p, size_t bytes, uint32_t seed) {
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    seed = seed * 1664525u + 1013904223u;
    // 1.0 .. 2.0 in float32; both halves are also ordinary bfloat16 numbers.
    const uint32_t bits = 0x3F803F80u | (seed & 0x007F007Fu);
    std::memcpy(p + i, &bits, 4);
  }
}

// Best (over `rounds` batches) seconds per call of `fn`.
double TimePerCall(const std::function<void()>& fn, size_t bytes_per_call, double min_seconds) {
  fn();  // warm up: page faults, caches
  const size_t calls = std::max<size_t>(
      1, static_cast<size_t>((size_t{256} << 20) / std::max<size_t>(bytes_per_call, 1)));
  double best = 1e30;
  double total = 0;
  for (int round = 0; round < 5 || total < min_seconds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t c = 0; c < calls; ++c) fn();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total += s;
    best = std::min(best, s / static_cast<double>(calls));
    if (round >= 50) break;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  internal::KernelOptions options{.isa = internal::BestIsa()};
  double min_seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--scalar") {
      options.isa = internal::Isa::kScalar;
    } else if (arg == "--stream-min-bytes" && i + 1 < argc) {
      options.streaming_store_min_bytes = std::strtoull(argv[++i], nullptr, 0);
    } else if (arg == "--min-seconds" && i + 1 < argc) {
      min_seconds = std::strtod(argv[++i], nullptr);
    } else {
      std::fprintf(stderr, "usage: %s [--scalar] [--stream-min-bytes N] [--min-seconds S]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("isa=%s streaming_store_min_bytes=%zu\n",
              options.isa == internal::Isa::kAvx2 ? "avx2" : "scalar",
              options.streaming_store_min_bytes);
  std::printf("%9s | %8s | %8s %6s | %8s %6s | %8s %6s | %8s %6s\n", "buffer", "memcpy", "f32 sum",
              "x mcpy", "f32 inpl", "x mcpy", "bf16 sum", "x mcpy", "f32 w16", "x mcpy");
  std::printf("%9s | %8s | %8s %6s | %8s %6s | %8s %6s | %8s %6s\n", "", "GB/s", "GB/s", "", "GB/s",
              "", "GB/s", "", "GB/s", "");

  for (size_t bytes = size_t{64} << 10; bytes <= size_t{64} << 20; bytes *= 4) {
    AlignedBuffer in0(bytes), in1(bytes), out0(bytes), out1(bytes);
    Fill(in0.data, bytes, 1);
    Fill(in1.data, bytes, 2);
    std::memset(out0.data, 0, bytes);
    std::memset(out1.data, 0, bytes);
    const void* inputs[2] = {in0.data, in1.data};
    void* outputs[2] = {out0.data, out1.data};
    void* in_place[2] = {in0.data, in1.data};

    const double t_memcpy =
        TimePerCall([&] { std::memcpy(out0.data, in0.data, bytes); }, 2 * bytes, min_seconds);

    auto reduce = [&](DataType dtype, DataType wire, void* const* outs) {
      ReduceSpec spec;
      spec.dtype = dtype;
      spec.op = ReduceOp::kSum;
      spec.wire_dtype = wire;
      const size_t count = bytes / hsdp::DataTypeSize(dtype);
      return TimePerCall([&] { internal::ReduceWith(options, spec, inputs, 2, outs, 2, count); },
                         4 * bytes, min_seconds);
    };
    const double t_f32 = reduce(DataType::kFloat32, DataType::kInvalid, outputs);
    // In place the values double every call and end up at +inf; infinities
    // cost the same as finite values (unlike subnormals). Refilled below.
    const double t_inplace = reduce(DataType::kFloat32, DataType::kInvalid, in_place);
    Fill(in0.data, bytes, 1);
    Fill(in1.data, bytes, 2);
    const double t_bf16 = reduce(DataType::kBFloat16, DataType::kInvalid, outputs);
    const double t_wire = reduce(DataType::kFloat32, DataType::kBFloat16, outputs);

    const auto gbps = [&](double streams, double t) { return streams * bytes / t / 1e9; };
    char label[32];
    if (bytes >= (size_t{1} << 20)) {
      std::snprintf(label, sizeof(label), "%zu MiB", bytes >> 20);
    } else {
      std::snprintf(label, sizeof(label), "%zu KiB", bytes >> 10);
    }
    std::printf("%9s | %8.1f | %8.1f %6.2f | %8.1f %6.2f | %8.1f %6.2f | %8.1f %6.2f\n", label,
                gbps(2, t_memcpy), gbps(4, t_f32), t_f32 / t_memcpy, gbps(4, t_inplace),
                t_inplace / t_memcpy, gbps(4, t_bf16), t_bf16 / t_memcpy, gbps(4, t_wire),
                t_wire / t_memcpy);
    std::fflush(stdout);
  }
  return 0;
}
