// The layout the overlap probe's three processes share (an anonymous shared
// mapping made before the forks) and its two halves: the trainer and the worker
// (gpu_overlap_probe.cu), driven by the parent (gpu_overlap_probe_main.cc, which
// says what the probe measures).
#ifndef HSDP_TOOLS_BENCH_GPU_OVERLAP_PROBE_H_
#define HSDP_TOOLS_BENCH_GPU_OVERLAP_PROBE_H_

#include <cuda_runtime.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace hsdp_probe {

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

inline double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

constexpr double kWaitLimitS = 120;  // no phase of a sane run takes this long

inline void WaitFor(const Line& l, uint32_t at_least) {
  const double give_up = Now() + kWaitLimitS;
  while (l.v.load(std::memory_order_acquire) < at_least) {
    if (Now() > give_up) _exit(3);  // the other process is gone: the parent reports it
    usleep(50);
  }
}

inline void Set(Line& l, uint32_t v) { l.v.store(v, std::memory_order_release); }

// The two halves, each in its own process after dropping to its uid; 0 when
// every part ran, else 1 with the reason in sh->error[0 or 1].
int Trainer(Shared* sh, Flags* fl, const Options& o);
int Worker(Shared* sh, Flags* fl, const Options& o);

}  // namespace hsdp_probe

#endif  // HSDP_TOOLS_BENCH_GPU_OVERLAP_PROBE_H_
