// hsdp-handoff-bench: what one hand-off between two processes through shared
// memory costs on this machine, with the waits hsdpd's clients and
// dispatcher use (shm::AwaitDoorbell) in each spin mode.
//
//   hsdp-handoff-bench [--mode before|pause|yield|all] [--extra-spinners K]
//                      [--iters 200000] [--spin-us 200] [--json]
//
// Two processes ping-pong a counter in a shared page: A writes n, B waits to
// see n and writes n+1, A waits to see n+1. One hand-off is half a round
// trip. --extra-spinners K adds K processes that spin in the same wait on a
// word nobody writes (as hsdpd's dispatcher or another rank does while an
// operation is in flight): with 2 + K spinners on fewer CPUs, what a hand-off
// costs then depends on how the spins share the CPUs, which is what the mode
// chooses (docs/benchmarks.md). "before" is the spin hsdpd used
// before the modes (a yield at the first failed poll, then every 64 polls).
// Prints p50 / p99 of the one-way time per mode, measured by A.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"

namespace {

struct alignas(64) Shared {
  std::atomic<uint64_t> ping;
  alignas(64) std::atomic<uint64_t> pong;
  alignas(64) std::atomic<uint32_t> stop;
  // Rung after each write, as the daemon and clients do (a syscall only
  // when the other side went to sleep after its spin).
  alignas(64) hsdp::shm::Doorbell bell_a;
  hsdp::shm::Doorbell bell_b;
  hsdp::shm::Doorbell bell_idle;
};

// Not a SpinMode: the waits as they were before spin modes existed (a yield
// after the first failed poll and every 64 polls), for comparison.
constexpr uint32_t kBefore = 100;

// AwaitDoorbell's spin in `mode`, or the one before spin modes (kBefore).
template <typename Ready>
void Await(hsdp::shm::Doorbell* bell, Ready&& ready, int64_t spin_ns, int64_t deadline_ns,
           uint32_t mode) {
  if (mode != kBefore) {
    hsdp::shm::AwaitDoorbell(bell, ready, spin_ns, deadline_ns, mode);
    return;
  }
  const int64_t spin_until = hsdp::shm::NowNanos() + spin_ns;
  for (uint32_t i = 0;; ++i) {
    if (ready()) return;
    if ((i & 63) == 0) {
      const int64_t now = hsdp::shm::NowNanos();
      if ((deadline_ns >= 0 && now >= deadline_ns) || now >= spin_until) break;
      sched_yield();
    }
    __builtin_ia32_pause();
  }
  hsdp::shm::AwaitDoorbell(bell, ready, 0, deadline_ns, hsdp::shm::kSpinYield);  // sleep
}

struct Options {
  std::vector<uint32_t> modes = {kBefore, hsdp::shm::kSpinPause, hsdp::shm::kSpinYield};
  int extra = 0;
  int iters = 200000;
  int64_t spin_ns = 200000;
  bool json = false;
};

const char* ModeName(uint32_t m) {
  return m == hsdp::shm::kSpinPause ? "pause" : m == hsdp::shm::kSpinYield ? "yield" : "before";
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "hsdp-handoff-bench: %s\n(see the comment at the top of "
               "tools/bench/handoff_bench.cc)\n", why.c_str());
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    auto number = [&](long lo, long hi) {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo || n > hi) {
        Usage(a + " takes an integer " + std::to_string(lo) + ".." + std::to_string(hi));
      }
      return n;
    };
    if (a == "--mode") {
      const std::string v = value();
      if (v == "all") continue;
      if (v == "before") o.modes = {kBefore};
      else if (v == "pause") o.modes = {hsdp::shm::kSpinPause};
      else if (v == "yield") o.modes = {hsdp::shm::kSpinYield};
      else Usage("unknown --mode " + v);
    } else if (a == "--extra-spinners") {
      o.extra = static_cast<int>(number(0, 64));
    } else if (a == "--iters") {
      o.iters = static_cast<int>(number(100, 100000000));
    } else if (a == "--spin-us") {
      o.spin_ns = number(0, 10000000) * 1000;
    } else if (a == "--json") {
      o.json = true;
    } else {
      Usage("unknown argument " + a);
    }
  }
  return o;
}

// Returns one-way times in ns (A's view), or empty when a child failed.
std::vector<double> RunMode(const Options& o, uint32_t mode) {
  void* m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  if (m == MAP_FAILED) Usage("mmap failed");
  auto* s = new (m) Shared();
  std::vector<pid_t> children;
  // B: echoes every ping.
  pid_t b = fork();
  if (b == 0) {
    for (uint64_t n = 1;; n += 2) {
      Await(
          &s->bell_b,
          [&] { return s->ping.load(std::memory_order_acquire) >= n || s->stop.load() != 0; },
          o.spin_ns, -1, mode);
      if (s->stop.load() != 0) _exit(0);
      s->pong.store(n + 1, std::memory_order_release);
      hsdp::shm::RingDoorbell(&s->bell_a);
    }
  }
  children.push_back(b);
  for (int k = 0; k < o.extra; ++k) {
    pid_t p = fork();
    if (p == 0) {
      // Spins as an idle dispatcher does (its spin budget renewed), until stopped.
      while (s->stop.load(std::memory_order_relaxed) == 0) {
        Await(
            &s->bell_idle, [&] { return s->stop.load(std::memory_order_relaxed) != 0; },
            o.spin_ns, hsdp::shm::NowNanos() + o.spin_ns, mode);
      }
      _exit(0);
    }
    children.push_back(p);
  }
  std::vector<double> one_way;
  one_way.reserve(o.iters);
  const int warmup = o.iters / 10;
  for (int i = 0; i < warmup + o.iters; ++i) {
    const uint64_t n = 2 * uint64_t(i) + 1;
    const int64_t t0 = hsdp::shm::NowNanos();
    s->ping.store(n, std::memory_order_release);
    hsdp::shm::RingDoorbell(&s->bell_b);
    Await(
        &s->bell_a, [&] { return s->pong.load(std::memory_order_acquire) >= n + 1; }, o.spin_ns,
        -1, mode);
    const int64_t t1 = hsdp::shm::NowNanos();
    if (i >= warmup) one_way.push_back(double(t1 - t0) / 2.0);
  }
  s->stop.store(1);
  hsdp::shm::RingDoorbell(&s->bell_b);
  bool ok = true;
  for (pid_t p : children) {
    int st = 0;
    if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = false;
  }
  munmap(m, sizeof(Shared));
  if (!ok) one_way.clear();
  return one_way;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (!o.json) {
    std::printf("# one hand-off through shared memory: 2 processes ping-pong, %d extra "
                "spinner(s), %ld online CPU(s), %d iterations (ns)\n",
                o.extra, cpus, o.iters);
    std::printf("%8s %10s %10s %10s\n", "mode", "p50(ns)", "p99(ns)", "mean(ns)");
  } else {
    std::printf("[");
  }
  bool first = true;
  for (uint32_t mode : o.modes) {
    std::vector<double> t = RunMode(o, mode);
    if (t.empty()) {
      std::fprintf(stderr, "hsdp-handoff-bench: a child process failed in mode %s\n",
                   ModeName(mode));
      return 1;
    }
    double mean = 0;
    for (double x : t) mean += x;
    mean /= double(t.size());
    std::sort(t.begin(), t.end());
    const double p50 = t[t.size() / 2], p99 = t[std::min(t.size() - 1, t.size() * 99 / 100)];
    if (o.json) {
      std::printf("%s\n  {\"mode\": \"%s\", \"extra_spinners\": %d, \"cpus\": %ld, "
                  "\"p50_ns\": %.1f, \"p99_ns\": %.1f, \"mean_ns\": %.1f}",
                  first ? "" : ",", ModeName(mode), o.extra, cpus, p50, p99, mean);
    } else {
      std::printf("%8s %10.1f %10.1f %10.1f\n", ModeName(mode), p50, p99, mean);
    }
    std::fflush(stdout);
    first = false;
  }
  if (o.json) std::printf("\n]\n");
  return 0;
}
