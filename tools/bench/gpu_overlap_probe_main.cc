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
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "tools/bench/gpu_overlap_probe.h"

namespace hsdp_probe {
namespace {

int DropTo(uid_t uid, char* err) {
  if (geteuid() != 0) return 0;  // not root: stay who we are
  if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
      setresuid(uid, uid, uid) != 0) {
    snprintf(err, 200, "dropping to uid %u: %s", unsigned(uid), strerror(errno));
    return 1;
  }
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

int Main(int argc, char** argv) {
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
                      "tools/bench/gpu_overlap_probe_main.cc)\n", a.c_str());
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

}  // namespace
}  // namespace hsdp_probe

int main(int argc, char** argv) { return hsdp_probe::Main(argc, argv); }
