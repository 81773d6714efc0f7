// hsdp-overlap-probe: what a second process, of another uid and without MPS,
// can run on the GPU while a trainer's kernel runs (issue 36; docs/gpu.md,
// "The overlap probe"). It decides the design of the per-uid device worker:
// whether the worker's copies overlap the trainer's kernels without MPS.
//
//   hsdp-overlap-probe [--kernel-ms 50] [--copy-mb 1024] [--reduce-mb 256]
//                      [--trainer-uid 60001] [--worker-uid 60002] [--same-uid]
//                      [--json FILE]
//
// Two child processes: the trainer and the worker, each dropping to its uid
// (setresgid + setresuid, when started as root) before its first CUDA call;
// the parent never touches CUDA. They meet through an anonymous shared
// mapping (phases, results, the IPC handle and the flags of part d).
//   (a) the trainer's compute kernel (fixed work, about --kernel-ms alone)
//       while the worker copies the trainer's buffer (opened from its CUDA IPC
//       handle; its own buffer if that fails) back to back for as long:
//       the time both take together against the longer of the two alone;
//   (b) the same with the worker running a small kernel (one block copying
//       4 KiB) back to back instead of the copies;
//   (c) a trainer's empty kernel launch + sync, alone on the GPU and with the
//       worker's context existing but idle;
//   (d) the flag hand-off: the trainer's stream writes a flag
//       (cuStreamWriteValue32, host-mapped shared memory), the worker's CPU
//       sees it, copies 4 KiB and has its stream write a flag the trainer's
//       stream waits on (cuStreamWaitValue32): round trip, median and p99;
//   (e) a two-input sum kernel (16-byte loads, fp32, and bf16 accumulated in
//       fp32) against a device-to-device copy of the same buffers: bytes/s.
// Times: CLOCK_MONOTONIC on the host (one clock for both processes) around
// work synchronised on its stream; the kernel's own interval from
// %globaltimer. Exit status 2 without a GPU, 1 when a part could not run,
// 0 otherwise (the figures are measurements, not pass/fail).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

struct Options {
  double kernel_ms = 50;
  size_t copy_mb = 1024;
  size_t reduce_mb = 256;
  uid_t trainer_uid = 60001;
  uid_t worker_uid = 60002;
  bool same_uid = false;
  std::string json;
};

// Written by both children; one cache line each for what the other polls.
struct alignas(64) Line {
  std::atomic<uint32_t> v{0};
  char pad[60];
};

enum Phase : uint32_t {
  kTrainerAlone = 1,   // (c) alone done, IPC handle published
  kWorkerReady,        // worker context, buffers, calibration done
  kTrainerReady,       // (c) idle done, kernel calibrated
  kCaseA, kCaseB,      // go signals (from the parent)
  kDoneA, kDoneB,
  kHandoff, kHandoffDone,
  kEnd,
};

struct Result {
  double start_s = 0, end_s = 0;  // host monotonic
  double alone_ms = 0;            // the same work alone
  uint64_t gpu_start_ns = 0, gpu_end_ns = 0;
  int count = 0;                  // copies or small kernels issued
};

// (d)'s flags, in a page of their own (registered with CUDA by both children).
struct Flags {
  Line a, b;  // trainer's stream -> worker's CPU; worker's stream -> trainer's stream
};

struct Shared {
  Line trainer_phase, worker_phase, parent_go;
  cudaIpcMemHandle_t handle;
  int handle_ok = 0;
  char ipc_error[160] = {};
  int worker_used_ipc = 0;
  double launch_alone_us = 0, launch_idle_us = 0;
  Result kernel_a, copy_a, kernel_b, small_b;
  double handoff_median_us = 0, handoff_p99_us = 0;
  int handoff_ok = 0;
  char handoff_error[160] = {};
  double copy_gbps = 0, sum_f32_gbps = 0, sum_bf16_gbps = 0;
  char error[2][200] = {};        // 0 trainer, 1 worker
};

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

constexpr double kWaitLimitS = 120;  // no phase of a sane run takes this long

void WaitFor(const Line& l, uint32_t at_least) {
  const double give_up = Now() + kWaitLimitS;
  while (l.v.load(std::memory_order_acquire) < at_least) {
    if (Now() > give_up) _exit(3);  // the other process is gone: the parent reports it
    usleep(50);
  }
}

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
void Set(Line& l, uint32_t v) { l.v.store(v, std::memory_order_release); }

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

int DropTo(uid_t uid, char* err) {
  if (geteuid() != 0) return 0;  // not root: stay who we are
  if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
      setresuid(uid, uid, uid) != 0) {
    snprintf(err, 200, "dropping to uid %u: %s", unsigned(uid), strerror(errno));
    return 1;
  }
  return 0;
}

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

// ---- the parent -------------------------------------------------------------
int GpuCount() {  // in a child: the parent must not initialise CUDA before forking
  pid_t p = fork();
  if (p == 0) {
    int n = 0;
    _exit(cudaGetDeviceCount(&n) == cudaSuccess ? std::min(n, 100) : 0);
  }
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

pid_t Spawn(Shared* sh, Flags* fl, const Options& o, bool trainer) {
  pid_t p = fork();
  if (p != 0) return p;
  char* err = sh->error[trainer ? 0 : 1];
  uid_t uid = trainer ? o.trainer_uid : (o.same_uid ? o.trainer_uid : o.worker_uid);
  if (DropTo(uid, err) != 0) _exit(1);
  _exit(trainer ? Trainer(sh, fl, o) : Worker(sh, fl, o));
}

double Ms(double s) { return s * 1e3; }

void Overlap(const char* what, const Result& k, const Result& w, FILE* out, bool json) {
  const double both = Ms(std::max(k.end_s, w.end_s) - std::min(k.start_s, w.start_s));
  const double longer = std::max(k.alone_ms, w.alone_ms);
  const double kc = Ms(k.end_s - k.start_s), wc = Ms(w.end_s - w.start_s);
  if (json) {
    fprintf(out,
            "\"%s\": {\"kernel_alone_ms\": %.3f, \"kernel_with_ms\": %.3f, "
            "\"worker_alone_ms\": %.3f, \"worker_with_ms\": %.3f, \"worker_ops\": %d, "
            "\"both_ms\": %.3f, \"both_over_longer\": %.3f, \"kernel_gpu_ms\": %.3f}",
            what, k.alone_ms, kc, w.alone_ms, wc, w.count, both, both / longer,
            (k.gpu_end_ns - k.gpu_start_ns) * 1e-6);
    return;
  }
  fprintf(out,
          "%s: kernel %.2f ms alone, %.2f ms with the worker (%.2f ms on %%globaltimer); "
          "worker %.2f ms alone, %.2f ms with the kernel (%d ops); both %.2f ms = %.2fx "
          "the longer alone (1.0: full overlap, %.2fx: none)\n",
          what, k.alone_ms, kc, (k.gpu_end_ns - k.gpu_start_ns) * 1e-6, w.alone_ms, wc,
          w.count, both, both / longer, (k.alone_ms + w.alone_ms) / longer);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "hsdp-overlap-probe: %s needs a value\n", a.c_str());
        exit(64);
      }
      return argv[++i];
    };
    if (a == "--kernel-ms") o.kernel_ms = atof(val());
    else if (a == "--copy-mb") o.copy_mb = strtoull(val(), nullptr, 10);
    else if (a == "--reduce-mb") o.reduce_mb = strtoull(val(), nullptr, 10);
    else if (a == "--trainer-uid") o.trainer_uid = uid_t(strtoul(val(), nullptr, 10));
    else if (a == "--worker-uid") o.worker_uid = uid_t(strtoul(val(), nullptr, 10));
    else if (a == "--same-uid") o.same_uid = true;
    else if (a == "--json") o.json = val();
    else {
      fprintf(stderr, "hsdp-overlap-probe: unknown argument %s (see the top of "
                      "tools/bench/gpu_overlap_probe.cu)\n", a.c_str());
      return 64;
    }
  }
  if (!(o.kernel_ms > 0 && o.kernel_ms <= 2000) || o.copy_mb == 0 || o.copy_mb > 65536 ||
      o.reduce_mb == 0 || o.reduce_mb > 65536) {
    fprintf(stderr, "hsdp-overlap-probe: --kernel-ms in (0, 2000], --copy-mb and --reduce-mb "
                    "in 1..65536\n");
    return 64;
  }
  if (GpuCount() == 0) {
    printf("hsdp-overlap-probe: no GPU (cudaGetDeviceCount found none)\n");
    return 2;
  }
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED || page == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  Shared* sh = new (mem) Shared();
  Flags* fl = new (page) Flags();
  pid_t t = Spawn(sh, fl, o, true), w = Spawn(sh, fl, o, false);
  int st_t = -1, st_w = -1;  // exit statuses once reaped
  auto reap = [&] {
    int st;
    if (st_t == -1 && waitpid(t, &st, WNOHANG) == t) st_t = st;
    if (st_w == -1 && waitpid(w, &st, WNOHANG) == w) st_w = st;
  };
  auto both_at = [&](uint32_t phase) {
    while (sh->trainer_phase.v.load() < phase || sh->worker_phase.v.load() < phase) {
      reap();
      if (st_t != -1 || st_w != -1) return false;  // one ended early
      usleep(200);
    }
    return true;
  };
  bool ok = both_at(kTrainerReady);
  for (uint32_t go : {kCaseA, kCaseB}) {
    if (!ok) break;
    Set(sh->parent_go, go);
    ok = both_at(go == kCaseA ? kDoneA : kDoneB);
  }
  if (ok) Set(sh->parent_go, kHandoff);
  const double give_up = Now() + (ok ? 120 : 0);
  for (reap(); (st_t == -1 || st_w == -1) && Now() < give_up; reap()) usleep(1000);
  if (st_t == -1 || st_w == -1) {  // stuck, or the other one failed: end both
    kill(t, SIGKILL);
    kill(w, SIGKILL);
    if (st_t == -1) waitpid(t, &st_t, 0);
    if (st_w == -1) waitpid(w, &st_w, 0);
  }
  const bool clean = ok && WIFEXITED(st_t) && WEXITSTATUS(st_t) == 0 && WIFEXITED(st_w) &&
                     WEXITSTATUS(st_w) == 0;

  printf("hsdp-overlap-probe: trainer uid %u, worker uid %u%s, no MPS unless the machine "
         "runs it\n", unsigned(geteuid() == 0 ? o.trainer_uid : geteuid()),
         unsigned(geteuid() == 0 ? (o.same_uid ? o.trainer_uid : o.worker_uid) : geteuid()),
         geteuid() == 0 ? "" : " (not root: both this process's uid)");
  printf("IPC: trainer handle %s; worker copies %s%s%s\n", sh->handle_ok ? "made" : "failed",
         sh->worker_used_ipc ? "the trainer's buffer" : "its own buffer",
         sh->ipc_error[0] ? " - " : "", sh->ipc_error);
  Overlap("(a) copies", sh->kernel_a, sh->copy_a, stdout, false);
  Overlap("(b) small kernels", sh->kernel_b, sh->small_b, stdout, false);
  printf("(c) launch + sync of an empty kernel: %.1f us alone, %.1f us with the worker's idle "
         "context\n", sh->launch_alone_us, sh->launch_idle_us);
  if (sh->handoff_ok) {
    printf("(d) flag hand-off round trip: median %.1f us, p99 %.1f us\n", sh->handoff_median_us,
           sh->handoff_p99_us);
  } else {
    printf("(d) flag hand-off: did not run (%s)\n", sh->handoff_error);
  }
  printf("(e) %zu MiB: copy %.0f GB/s; sum fp32 %.0f GB/s (%.2f of the copy), bf16 %.0f GB/s "
         "(%.2f)\n", o.reduce_mb, sh->copy_gbps, sh->sum_f32_gbps,
         sh->copy_gbps > 0 ? sh->sum_f32_gbps / sh->copy_gbps : 0, sh->sum_bf16_gbps,
         sh->copy_gbps > 0 ? sh->sum_bf16_gbps / sh->copy_gbps : 0);
  for (int i = 0; i < 2; ++i) {
    if (sh->error[i][0]) printf("%s error: %s\n", i == 0 ? "trainer" : "worker", sh->error[i]);
  }
  if (!o.json.empty()) {
    FILE* f = fopen(o.json.c_str(), "w");
    if (f != nullptr) {
      fprintf(f, "{\"ipc_used\": %d, ", sh->worker_used_ipc);
      Overlap("a_copies", sh->kernel_a, sh->copy_a, f, true);
      fprintf(f, ", ");
      Overlap("b_small_kernels", sh->kernel_b, sh->small_b, f, true);
      fprintf(f, ", \"c_launch_alone_us\": %.2f, \"c_launch_idle_worker_us\": %.2f, "
                 "\"d_handoff_ok\": %d, \"d_handoff_median_us\": %.2f, \"d_handoff_p99_us\": %.2f, "
                 "\"e_copy_gbps\": %.1f, \"e_sum_f32_gbps\": %.1f, \"e_sum_bf16_gbps\": %.1f, "
                 "\"complete\": %d}\n",
              sh->launch_alone_us, sh->launch_idle_us, sh->handoff_ok, sh->handoff_median_us,
              sh->handoff_p99_us, sh->copy_gbps, sh->sum_f32_gbps, sh->sum_bf16_gbps, clean);
      fclose(f);
    }
  }
  return clean ? 0 : 1;
}
