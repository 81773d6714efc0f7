// The overlap probe's trainer and worker (gpu_overlap_probe.h; what they
// measure: gpu_overlap_probe_main.cc). Each runs in its own process, after
// dropping to its uid, and meets the other through the shared layout.
#include "tools/bench/gpu_overlap_probe.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace hsdp_probe {
namespace {

// The driver's stream memory operations, without linking libcuda (a machine
// without a driver can still run the binary and be told there is no GPU).
struct StreamMemOps {
  decltype(&::cuStreamWriteValue32_v2) write = nullptr;
  decltype(&::cuStreamWaitValue32_v2) wait = nullptr;
  bool Load() {
    cudaDriverEntryPointQueryResult q;
    return cudaGetDriverEntryPointByVersion("cuStreamWriteValue32",
                                            reinterpret_cast<void**>(&write), 12000,
                                            cudaEnableDefault, &q) == cudaSuccess &&
           q == cudaDriverEntryPointSuccess &&
           cudaGetDriverEntryPointByVersion("cuStreamWaitValue32",
                                            reinterpret_cast<void**>(&wait), 12000,
                                            cudaEnableDefault, &q) == cudaSuccess &&
           q == cudaDriverEntryPointSuccess && write != nullptr && wait != nullptr;
  }
};

// Registers the flags page with this process's context; its device address.
CUdeviceptr MapFlags(Flags* f, cudaError_t* e) {
  *e = cudaHostRegister(f, 4096, cudaHostRegisterMapped);
  if (*e != cudaSuccess) return 0;
  void* d = nullptr;
  *e = cudaHostGetDevicePointer(&d, f, 0);
  return reinterpret_cast<CUdeviceptr>(d);
}

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Fixed work: `iters` dependent FMAs a thread; block 0 stamps the start, the
// last block to finish the end.
__global__ void Compute(int iters, float* sink, unsigned long long* stamps,
                        unsigned* finished) {
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicMin(&stamps[0], GlobalTimer());
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f;
  for (int i = 0; i < iters; ++i) a = fmaf(a, b, c);
  if (a == 12345.678f) sink[0] = a;  // keeps the loop
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(finished, 1u) == gridDim.x - 1) {
    atomicMax(&stamps[1], GlobalTimer());
  }
}

__global__ void Empty() {}

__global__ void SmallCopy(const uint4* src, uint4* dst) {  // 4 KiB, one block
  dst[threadIdx.x] = src[threadIdx.x];
}

__global__ void SumF32(const float4* a, const float4* b, float4* out, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 x = a[i], y = b[i];
    out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

__global__ void SumBf16(const uint4* a, const uint4* b, uint4* out, size_t n8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8;
       i += size_t(gridDim.x) * blockDim.x) {
    uint4 x = a[i], y = b[i], r;
    const __nv_bfloat162* xs = reinterpret_cast<const __nv_bfloat162*>(&x);
    const __nv_bfloat162* ys = reinterpret_cast<const __nv_bfloat162*>(&y);
    __nv_bfloat162* rs = reinterpret_cast<__nv_bfloat162*>(&r);
    for (int k = 0; k < 4; ++k) {
      float2 fx = __bfloat1622float2(xs[k]), fy = __bfloat1622float2(ys[k]);
      rs[k] = __floats2bfloat162_rn(fx.x + fy.x, fx.y + fy.y);
    }
    out[i] = r;
  }
}

#define CK(call)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      snprintf(err, sizeof(Shared::error[0]), "%s: %s", #call, cudaGetErrorString(e_)); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)


double LaunchSyncUs(cudaStream_t s, int n) {
  std::vector<double> t(n);
  for (int i = 0; i < n; ++i) {
    double a = Now();
    Empty<<<1, 1, 0, s>>>();
    cudaStreamSynchronize(s);
    t[i] = (Now() - a) * 1e6;
  }
  std::sort(t.begin(), t.end());
  return t[n / 2];
}

int SmCount() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return sms > 0 ? sms : 1;
}

}  // namespace

// ---- the trainer ------------------------------------------------------------
int Trainer(Shared* sh, Flags* fl, const Options& o) {
  char* err = sh->error[0];
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* buf = nullptr;
  const size_t bytes = o.copy_mb << 20;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMemset(buf, 1, bytes));
  cudaError_t ipc = cudaIpcGetMemHandle(&sh->handle, buf);
  sh->handle_ok = ipc == cudaSuccess;
  if (!sh->handle_ok) snprintf(sh->ipc_error, sizeof(sh->ipc_error), "%s", cudaGetErrorString(ipc));
  LaunchSyncUs(s, 200);  // warm
  sh->launch_alone_us = LaunchSyncUs(s, 2000);
  Set(sh->trainer_phase, kTrainerAlone);
  WaitFor(sh->worker_phase, kWorkerReady);
  sh->launch_idle_us = LaunchSyncUs(s, 2000);

  // Calibrate the compute kernel to about kernel_ms alone.
  const int blocks = SmCount() * 4;
  float* sink;
  unsigned long long* stamps;
  unsigned* finished;
  CK(cudaMalloc(&sink, 4));
  CK(cudaMalloc(&stamps, 16));
  CK(cudaMalloc(&finished, 4));
  auto run = [&](int iters, Result* r) -> cudaError_t {
    const unsigned long long init[2] = {~0ull, 0ull};
    cudaMemcpyAsync(stamps, init, 16, cudaMemcpyHostToDevice, s);
    cudaMemsetAsync(finished, 0, 4, s);
    cudaStreamSynchronize(s);
    double a = Now();
    Compute<<<blocks, 256, 0, s>>>(iters, sink, stamps, finished);
    cudaError_t e = cudaStreamSynchronize(s);
    double b = Now();
    unsigned long long got[2];
    cudaMemcpy(got, stamps, 16, cudaMemcpyDeviceToHost);
    if (r != nullptr) {
      r->start_s = a;
      r->end_s = b;
      r->gpu_start_ns = got[0];
      r->gpu_end_ns = got[1];
    }
    return e != cudaSuccess ? e : cudaGetLastError();
  };
  int iters = 1 << 16;
  Result r;
  for (int k = 0; k < 8; ++k) {
    CK(run(iters, &r));
    double ms = (r.end_s - r.start_s) * 1e3;
    if (std::fabs(ms - o.kernel_ms) < 0.05 * o.kernel_ms) break;
    iters = int(std::min(2e9, iters * o.kernel_ms / std::max(ms, 0.01)));
  }
  double alone = 1e30;
  for (int k = 0; k < 3; ++k) {
    CK(run(iters, &r));
    alone = std::min(alone, (r.end_s - r.start_s) * 1e3);
  }
  sh->kernel_a.alone_ms = sh->kernel_b.alone_ms = alone;
  Set(sh->trainer_phase, kTrainerReady);

  WaitFor(sh->parent_go, kCaseA);
  CK(run(iters, &sh->kernel_a));
  Set(sh->trainer_phase, kDoneA);
  WaitFor(sh->parent_go, kCaseB);
  CK(run(iters, &sh->kernel_b));
  Set(sh->trainer_phase, kDoneB);

  // (d) the flag hand-off.
  WaitFor(sh->parent_go, kHandoff);
  cudaError_t reg;
  const CUdeviceptr fa = MapFlags(fl, &reg);
  const CUdeviceptr fb = fa + sizeof(Line);
  StreamMemOps ops;
  std::vector<double> rt;
  const int rounds = 1000;
  if (reg != cudaSuccess) {
    snprintf(sh->handoff_error, sizeof(sh->handoff_error), "cudaHostRegister: %s",
             cudaGetErrorString(reg));
  } else if (!ops.Load()) {
    snprintf(sh->handoff_error, sizeof(sh->handoff_error),
             "no driver entry point cuStreamWriteValue32 / cuStreamWaitValue32");
  }
  for (int i = 1; reg == cudaSuccess && ops.write != nullptr && i <= rounds; ++i) {
    double a = Now();
    CUresult w = ops.write(s, fa, i, CU_STREAM_WRITE_VALUE_DEFAULT);
    CUresult v = ops.wait(s, fb, i, CU_STREAM_WAIT_VALUE_GEQ);
    if (w != CUDA_SUCCESS || v != CUDA_SUCCESS) {
      snprintf(sh->handoff_error, sizeof(sh->handoff_error), "stream memory op: CUresult %d",
               int(w != CUDA_SUCCESS ? w : v));
      break;
    }
    cudaError_t e;
    const double give_up = Now() + 5;
    while ((e = cudaStreamQuery(s)) == cudaErrorNotReady && Now() < give_up) {
    }
    if (e != cudaSuccess) {
      snprintf(sh->handoff_error, sizeof(sh->handoff_error), "round %d: %s", i,
               e == cudaErrorNotReady ? "the worker's flag never came (5 s)"
                                      : cudaGetErrorString(e));
      break;
    }
    rt.push_back((Now() - a) * 1e6);
  }
  Set(fl->a, rounds + 1);  // releases the worker whatever happened
  Set(fl->b, rounds + 1);  // ... and a wait of our stream left behind
  cudaStreamSynchronize(s);
  if (rt.size() == size_t(rounds)) {
    std::sort(rt.begin(), rt.end());
    sh->handoff_median_us = rt[rounds / 2];
    sh->handoff_p99_us = rt[rounds * 99 / 100];
    sh->handoff_ok = 1;
  }
  WaitFor(sh->worker_phase, kHandoffDone);

  // (e) alone again: the sum kernels against the copy.
  const size_t n = o.reduce_mb << 20;
  char *a, *b, *out;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMalloc(&out, n));
  CK(cudaMemset(a, 0, n));
  CK(cudaMemset(b, 0, n));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int grid = SmCount() * 8;  // >= 2 waves of 1024-thread-resident SMs
  auto timed = [&](auto&& launch) -> double {
    launch();
    cudaEventRecord(e0, s);
    for (int k = 0; k < 10; ++k) launch();
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / 10;
  };
  double copy_ms = timed([&] { cudaMemcpyAsync(out, a, n, cudaMemcpyDeviceToDevice, s); });
  double f32_ms = timed([&] {
    SumF32<<<grid, 256, 0, s>>>(reinterpret_cast<const float4*>(a),
                                reinterpret_cast<const float4*>(b),
                                reinterpret_cast<float4*>(out), n / 16);
  });
  double bf16_ms = timed([&] {
    SumBf16<<<grid, 256, 0, s>>>(reinterpret_cast<const uint4*>(a),
                                 reinterpret_cast<const uint4*>(b),
                                 reinterpret_cast<uint4*>(out), n / 16);
  });
  CK(cudaGetLastError());
  sh->copy_gbps = 2.0 * n / (copy_ms * 1e-3) / 1e9;
  sh->sum_f32_gbps = 3.0 * n / (f32_ms * 1e-3) / 1e9;
  sh->sum_bf16_gbps = 3.0 * n / (bf16_ms * 1e-3) / 1e9;
  Set(sh->trainer_phase, kEnd);
  return 0;
}

// ---- the worker -------------------------------------------------------------
int Worker(Shared* sh, Flags* fl, const Options& o) {
  char* err = sh->error[1];
  WaitFor(sh->trainer_phase, kTrainerAlone);  // no context of ours before (c) alone
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t bytes = o.copy_mb << 20;
  void* src = nullptr;
  if (sh->handle_ok) {
    cudaError_t e = cudaIpcOpenMemHandle(&src, sh->handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      snprintf(sh->ipc_error, sizeof(sh->ipc_error), "cudaIpcOpenMemHandle: %s",
               cudaGetErrorString(e));
      src = nullptr;
    }
  }
  sh->worker_used_ipc = src != nullptr;
  if (src == nullptr) {
    CK(cudaMalloc(&src, bytes));
    CK(cudaMemset(src, 2, bytes));
  }
  void* dst;
  CK(cudaMalloc(&dst, bytes));
  // Calibrate: one copy and one small kernel alone.
  auto copies = [&](int n) -> double {
    double a = Now();
    for (int i = 0; i < n; ++i) cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
    cudaStreamSynchronize(s);
    return (Now() - a) * 1e3;
  };
  auto smalls = [&](int n) -> double {
    double a = Now();
    for (int i = 0; i < n; ++i) {
      SmallCopy<<<1, 256, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst));
    }
    cudaStreamSynchronize(s);
    return (Now() - a) * 1e3;
  };
  copies(1);
  smalls(10);
  CK(cudaGetLastError());
  Set(sh->worker_phase, kWorkerReady);
  WaitFor(sh->trainer_phase, kTrainerReady);
  const double target = sh->kernel_a.alone_ms;
  const double one_copy = std::max(1e-3, copies(3) / 3);
  const int n_copies = int(std::clamp(target / one_copy, 1.0, 100000.0));
  const double one_small = std::max(1e-4, smalls(200) / 200);
  const int n_smalls = int(std::clamp(target / one_small, 1.0, 1000000.0));
  sh->copy_a.alone_ms = copies(n_copies);
  sh->small_b.alone_ms = smalls(n_smalls);
  CK(cudaGetLastError());
  Set(sh->worker_phase, kTrainerReady);  // calibrated: both are now ready for (a)

  WaitFor(sh->parent_go, kCaseA);
  sh->copy_a.count = n_copies;
  sh->copy_a.start_s = Now();
  copies(n_copies);
  sh->copy_a.end_s = Now();
  Set(sh->worker_phase, kDoneA);
  WaitFor(sh->parent_go, kCaseB);
  sh->small_b.count = n_smalls;
  sh->small_b.start_s = Now();
  smalls(n_smalls);
  sh->small_b.end_s = Now();
  CK(cudaGetLastError());
  Set(sh->worker_phase, kDoneB);

  // (d): see flag_a, copy 4 KiB, have the stream write flag_b.
  WaitFor(sh->parent_go, kHandoff);
  cudaError_t reg;
  const CUdeviceptr fb = MapFlags(fl, &reg) + sizeof(Line);
  StreamMemOps ops;
  const bool can = reg == cudaSuccess && ops.Load();
  for (uint32_t i = 1;; ++i) {
    uint32_t seen;
    const double give_up = Now() + 10;
    while ((seen = fl->a.v.load(std::memory_order_acquire)) < i && Now() < give_up) {
    }
    if (seen < i || seen > 1000 || !can) break;  // the trainer ended, gave up or is gone
    cudaMemcpyAsync(dst, src, 4096, cudaMemcpyDeviceToDevice, s);
    if (ops.write(s, fb, i, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) break;
  }
  cudaStreamSynchronize(s);
  Set(sh->worker_phase, kHandoffDone);
  WaitFor(sh->trainer_phase, kEnd);
  if (sh->worker_used_ipc) cudaIpcCloseMemHandle(src);
  return 0;
}

}  // namespace hsdp_probe
