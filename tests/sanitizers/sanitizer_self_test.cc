// Proves the sanitizer builds can fail: each mode commits one bug on
// purpose, and ctest (tests/sanitizers/CMakeLists.txt) expects the
// sanitizer's report for it; "clean" must produce none. For TSan this also
// shows that absl_tsan_shim.cc orders abseil's Mutex without hiding a race
// next to it.
//
//   sanitizer_self_test clean | absl-race | heap-overflow | signed-overflow | leak
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

absl::Mutex mu;
long guarded = 0;  // always under mu
volatile long racy = 0;  // written by both threads, unordered (mode absl-race)

// Two threads share `guarded` under an abseil Mutex (and Await, and a
// Notification): no report. With `race`, each thread also writes `racy`
// with nothing ordering the two writes (the child right after it starts, the
// parent right after starting it): the report TSan must make.
int Threads(bool race) {
  absl::Notification ready;
  bool go = false;
  std::thread t([&] {
    if (race) racy = 1;
    ready.WaitForNotification();
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock l(&mu);
      ++guarded;
    }
    absl::MutexLock l(&mu);
    go = true;
  });
  if (race) racy = 2;
  ready.Notify();
  for (int i = 0; i < 1000; ++i) {
    absl::MutexLock l(&mu);
    ++guarded;
  }
  {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(&go));
  }
  t.join();
  return guarded == 2000 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "clean";
  if (mode == "clean") return Threads(false);
  if (mode == "absl-race") return Threads(true);
  if (mode == "heap-overflow") {
    char* volatile p = static_cast<char*>(std::malloc(8));  // volatile: not elided
    p[8 + (argc > 2)] = 1;  // one byte past the end
    std::free(p);
    return 0;
  }
  if (mode == "signed-overflow") {
    volatile int x = 0x7fffffff;
    return x + argc > 0 ? 0 : 1;  // INT_MAX + 2
  }
  if (mode == "leak") {
    void* volatile p = std::malloc(4096);
    p = nullptr;
    return p == nullptr ? 0 : 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
