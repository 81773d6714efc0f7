// Doorbells: futex wake across threads and processes, timeouts, and a
// ping-pong stress loop that would hang on a lost wakeup.
#include "hsdp/shm/doorbell.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <thread>

#include "gtest/gtest.h"

namespace hsdp::shm {
namespace {

constexpr int64_t kMs = 1'000'000;

// A page shared with forked children.
struct SharedPage {
  SharedPage() {
    mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(mem, MAP_FAILED);
  }
  ~SharedPage() { ::munmap(mem, 4096); }
  void* mem;
};

struct PingPong {
  Doorbell a;  // rung by the pinger
  Doorbell b;  // rung by the ponger
  alignas(64) std::atomic<uint64_t> ping;
  alignas(64) std::atomic<uint64_t> pong;
};

bool WaitFor(Doorbell* bell, std::atomic<uint64_t>* v, uint64_t want, int64_t spin_ns) {
  return AwaitDoorbell(bell, [&] { return v->load(std::memory_order_acquire) >= want; }, spin_ns,
                       NowNanos() + 10'000 * kMs);
}

int WaitStatus(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(DoorbellTest, RingBumpsSequenceWithoutSleepers) {
  Doorbell bell{};
  RingDoorbell(&bell);
  RingDoorbell(&bell);
  EXPECT_EQ(bell.seq.load(), 2u);
  EXPECT_EQ(bell.waiters.load(), 0u);
}

TEST(DoorbellTest, SleepReturnsAtOnceWhenSequenceAlreadyMoved) {
  Doorbell bell{};
  bell.seq.store(5);
  const int64_t t0 = NowNanos();
  SleepOnDoorbell(&bell, 4, 5'000 * kMs);
  EXPECT_LT(NowNanos() - t0, 1'000 * kMs);
  EXPECT_EQ(bell.waiters.load(), 0u);
}

TEST(DoorbellTest, TimesOut) {
  Doorbell bell{};
  const int64_t t0 = NowNanos();
  EXPECT_FALSE(AwaitDoorbell(&bell, [] { return false; }, 0, t0 + 50 * kMs));
  const int64_t took = NowNanos() - t0;
  EXPECT_GE(took, 50 * kMs);
  EXPECT_LT(took, 2'000 * kMs);
  const int64_t t1 = NowNanos();
  SleepOnDoorbell(&bell, bell.seq.load(), 30 * kMs);
  EXPECT_GE(NowNanos() - t1, 25 * kMs);
  EXPECT_EQ(bell.waiters.load(), 0u);
}

TEST(DoorbellTest, ReadyBeforeDeadlineReturnsTrue) {
  Doorbell bell{};
  EXPECT_TRUE(AwaitDoorbell(&bell, [] { return true; }, 0, NowNanos()));
}

TEST(DoorbellTest, WakesASleepingThread) {
  Doorbell bell{};
  std::atomic<uint64_t> flag{0};
  std::atomic<bool> woke{false};
  std::thread t([&] {
    woke = WaitFor(&bell, &flag, 1, /*spin_ns=*/0);
  });
  // Wait until the thread really sleeps in the futex.
  const int64_t until = NowNanos() + 5'000 * kMs;
  while (bell.waiters.load() == 0 && NowNanos() < until) std::this_thread::yield();
  ASSERT_EQ(bell.waiters.load(), 1u);
  const int64_t t0 = NowNanos();
  flag.store(1, std::memory_order_release);
  RingDoorbell(&bell);
  t.join();
  EXPECT_TRUE(woke.load());
  EXPECT_LT(NowNanos() - t0, 1'000 * kMs);
}

TEST(DoorbellTest, WakesASleepingProcess) {
  SharedPage page;
  auto* pp = new (page.mem) PingPong();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(WaitFor(&pp->a, &pp->ping, 1, 0) ? 0 : 1);
  const int64_t until = NowNanos() + 5'000 * kMs;
  while (pp->a.waiters.load() == 0 && NowNanos() < until) std::this_thread::yield();
  ASSERT_EQ(pp->a.waiters.load(), 1u) << "the child never went to sleep";
  pp->ping.store(1, std::memory_order_release);
  RingDoorbell(&pp->a);
  EXPECT_EQ(WaitStatus(pid), 0);
}

// Ping-pong where every wait goes to sleep (no spin): a lost wakeup hangs one
// side until the 10 s deadline and fails the test.
void PingPongLoop(PingPong* pp, uint64_t rounds, bool pinger, int64_t spin_ns, bool* ok) {
  *ok = true;
  for (uint64_t i = 1; i <= rounds; ++i) {
    if (pinger) {
      pp->ping.store(i, std::memory_order_release);
      RingDoorbell(&pp->a);
      if (!WaitFor(&pp->b, &pp->pong, i, spin_ns)) {
        *ok = false;
        return;
      }
    } else {
      if (!WaitFor(&pp->a, &pp->ping, i, spin_ns)) {
        *ok = false;
        return;
      }
      pp->pong.store(i, std::memory_order_release);
      RingDoorbell(&pp->b);
    }
  }
}

TEST(DoorbellTest, NoLostWakeupsAcrossThreads) {
  PingPong pp{};
  bool ok_a = false, ok_b = false;
  std::thread ponger([&] { PingPongLoop(&pp, 20000, false, 0, &ok_b); });
  PingPongLoop(&pp, 20000, true, 0, &ok_a);
  ponger.join();
  EXPECT_TRUE(ok_a);
  EXPECT_TRUE(ok_b);
  EXPECT_EQ(pp.pong.load(), 20000u);
}

TEST(DoorbellTest, NoLostWakeupsAcrossProcesses) {
  SharedPage page;
  auto* pp = new (page.mem) PingPong();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    bool ok = false;
    PingPongLoop(pp, 10000, false, 2000, &ok);
    _exit(ok ? 0 : 1);
  }
  bool ok = false;
  PingPongLoop(pp, 10000, true, 0, &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(WaitStatus(pid), 0);
  EXPECT_EQ(pp->pong.load(), 10000u);
}

TEST(DoorbellTest, ManySleepersAllWake) {
  Doorbell bell{};
  std::atomic<uint64_t> flag{0};
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      if (WaitFor(&bell, &flag, 1, 0)) woke.fetch_add(1);
    });
  }
  const int64_t until = NowNanos() + 5'000 * kMs;
  while (bell.waiters.load() < 4 && NowNanos() < until) std::this_thread::yield();
  flag.store(1);
  RingDoorbell(&bell);
  for (auto& t : threads) t.join();
  EXPECT_EQ(woke.load(), 4);
}

}  // namespace
}  // namespace hsdp::shm
