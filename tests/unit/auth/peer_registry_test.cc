// ConnectionLimiter (per-uid counts, root exempt, slots released when they
// go) and PeerRegistry (credentials by fd; Sweep notices closed and reused
// fd numbers and releases their slots).
#include "daemon/auth/peer_registry.h"

#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace hsdp {
namespace {

TEST(ConnectionLimiterTest, CapsEachUidAndReleasesOnDestruction) {
  auto limiter = ConnectionLimiter::Create(2);
  std::optional<ConnectionSlot> a = limiter->TryAcquire(1000);
  std::optional<ConnectionSlot> b = limiter->TryAcquire(1000);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_FALSE(limiter->TryAcquire(1000).has_value());
  EXPECT_EQ(limiter->Live(1000), 2u);
  // Other uids have their own count.
  std::optional<ConnectionSlot> other = limiter->TryAcquire(1001);
  EXPECT_TRUE(other.has_value());
  // Moving keeps one count; destroying releases it.
  ConnectionSlot moved = std::move(*a);
  a.reset();
  EXPECT_EQ(limiter->Live(1000), 2u);
  moved = ConnectionSlot();
  EXPECT_EQ(limiter->Live(1000), 1u);
  EXPECT_TRUE(limiter->TryAcquire(1000).has_value());  // acquired and released at once
  EXPECT_EQ(limiter->Live(1000), 1u);
}

TEST(ConnectionLimiterTest, RootIsCountedButNeverRefused) {
  auto limiter = ConnectionLimiter::Create(1);
  std::vector<ConnectionSlot> slots;
  for (int i = 0; i < 10; ++i) {
    std::optional<ConnectionSlot> s = limiter->TryAcquire(0);
    ASSERT_TRUE(s.has_value());
    slots.push_back(std::move(*s));
  }
  EXPECT_EQ(limiter->Live(0), 10u);
}

TEST(ConnectionLimiterTest, SlotsOutliveTheirLimiterOwner) {
  std::optional<ConnectionSlot> slot;
  std::weak_ptr<ConnectionLimiter> seen;
  {
    auto limiter = ConnectionLimiter::Create(1);
    seen = limiter;
    slot = limiter->TryAcquire(5);
    ASSERT_TRUE(slot.has_value());
  }
  // The owner's pointer is gone; the slot keeps the limiter alive and still
  // counted against uid 5.
  std::shared_ptr<ConnectionLimiter> alive = seen.lock();
  ASSERT_NE(alive, nullptr) << "the slot did not keep its limiter alive";
  EXPECT_EQ(alive->Live(5), 1u);
  EXPECT_FALSE(alive->TryAcquire(5).has_value());
  alive.reset();
  slot.reset();  // the last owner: releases into a live limiter, then frees it (ASan checks)
  EXPECT_TRUE(seen.expired()) << "the limiter outlived its last slot";
}

struct Pair {
  Pair() { ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd); }
  ~Pair() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
  int fd[2] = {-1, -1};
};

TEST(PeerRegistryTest, SweepReleasesClosedAndReusedConnections) {
  auto limiter = ConnectionLimiter::Create(2);
  PeerRegistry peers({});
  Pair p1, p2;
  peers.Add(p1.fd[0], PeerCred{11, 1000, 1000}, std::move(*limiter->TryAcquire(1000)));
  peers.Add(p2.fd[0], PeerCred{12, 1000, 1000}, std::move(*limiter->TryAcquire(1000)));
  EXPECT_FALSE(limiter->TryAcquire(1000).has_value());
  EXPECT_EQ(peers.Sweep(), 0u);  // both alive
  ASSERT_TRUE(peers.Lookup("fd:" + std::to_string(p1.fd[0])).has_value());
  EXPECT_EQ(peers.Lookup("fd:" + std::to_string(p1.fd[0]))->pid, 11);

  // gRPC closes p1's fd: the next sweep frees its slot.
  const int closed_number = p1.fd[0];
  ::close(p1.fd[0]);
  p1.fd[0] = -1;
  EXPECT_EQ(peers.Sweep(), 1u);
  EXPECT_EQ(limiter->Live(1000), 1u);
  EXPECT_FALSE(peers.Lookup("fd:" + std::to_string(closed_number)).has_value());

  // gRPC closes p2's fd and the number is reused by another socket.
  const int reused_number = p2.fd[0];
  ::close(p2.fd[0]);
  Pair p3;
  ASSERT_EQ(::dup2(p3.fd[0], reused_number), reused_number);
  p2.fd[0] = reused_number;  // closed by p2's destructor
  EXPECT_EQ(peers.Sweep(), 1u);
  EXPECT_EQ(limiter->Live(1000), 0u);
}

TEST(PeerRegistryTest, AddOverANumberReleasesTheOldSlot) {
  auto limiter = ConnectionLimiter::Create(5);
  PeerRegistry peers({});
  Pair p;
  peers.Add(p.fd[0], PeerCred{1, 1000, 1000}, std::move(*limiter->TryAcquire(1000)));
  peers.Add(p.fd[0], PeerCred{2, 2000, 2000}, std::move(*limiter->TryAcquire(2000)));
  EXPECT_EQ(limiter->Live(1000), 0u);
  EXPECT_EQ(limiter->Live(2000), 1u);
  EXPECT_EQ(peers.Lookup("fd:" + std::to_string(p.fd[0]))->uid, 2000u);
  EXPECT_EQ(peers.size(), 1u);
}

TEST(PeerRegistryTest, DefaultAllowedUidsAreOwnAndRoot) {
  PeerRegistry peers({});
  EXPECT_TRUE(peers.Allowed(::getuid()));
  EXPECT_TRUE(peers.Allowed(0));
  PeerRegistry only({1234});
  EXPECT_TRUE(only.Allowed(1234));
  EXPECT_FALSE(only.Allowed(1235));
}

}  // namespace
}  // namespace hsdp
