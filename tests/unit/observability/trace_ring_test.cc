// TraceRing: records only while armed, overwrites the oldest events at
// capacity, and filters windows by time, owner uid and job.
#include "daemon/observability/trace_ring.h"

#include "gtest/gtest.h"

namespace hsdp {
namespace {

TraceEvent At(int64_t ts, uint32_t group, uint64_t seq = 1) {
  TraceEvent e;
  e.ts_ns = ts;
  e.group_id = group;
  e.seq = seq;
  return e;
}

TEST(TraceRingTest, RecordsOnlyWhileArmed) {
  TraceRing ring(1024);
  EXPECT_FALSE(ring.MaybeRecording());
  EXPECT_FALSE(ring.Recording(100));
  ASSERT_TRUE(ring.Arm(100, 50));
  EXPECT_TRUE(ring.MaybeRecording());
  EXPECT_TRUE(ring.Recording(149));
  EXPECT_FALSE(ring.Recording(150));  // expired: switches itself off
  EXPECT_FALSE(ring.MaybeRecording());
  EXPECT_EQ(ring.armed_until_ns(), 0);
}

TEST(TraceRingTest, ArmExtendsButNeverShortens) {
  TraceRing ring(1024);
  ASSERT_TRUE(ring.Arm(0, 1000));
  ASSERT_TRUE(ring.Arm(0, 10));
  EXPECT_EQ(ring.armed_until_ns(), 1000);
  ASSERT_TRUE(ring.Arm(500, 1000));
  EXPECT_EQ(ring.armed_until_ns(), 1500);
}

TEST(TraceRingTest, ZeroCapacityNeverRecords) {
  TraceRing ring(0);
  EXPECT_FALSE(ring.Arm(0, 1000));
  EXPECT_FALSE(ring.Recording(1));
  EXPECT_TRUE(ring.Window(0, 100, -1, "").events.empty());
}

TEST(TraceRingTest, OverwritesOldestAtCapacity) {
  TraceRing ring(1024);
  ASSERT_TRUE(ring.Arm(0, 1'000'000));
  ring.NoteGroup(7, {"job", 1000, 2});
  for (int i = 0; i < 1500; ++i) {
    const TraceEvent e = At(i, 7, i);
    ring.Append({&e, 1});
  }
  const TraceSnapshot s = ring.Window(0, 1'000'000, -1, "");
  ASSERT_EQ(s.events.size(), 1024u);
  EXPECT_EQ(s.overwritten, 1500u - 1024u);
  EXPECT_EQ(s.events.front().seq, 1500u - 1024u);  // oldest kept, in order
  EXPECT_EQ(s.events.back().seq, 1499u);
}

TEST(TraceRingTest, WindowFiltersByTimeUidAndJob) {
  TraceRing ring(1024);
  ASSERT_TRUE(ring.Arm(0, 1'000'000));
  ring.NoteGroup(1, {"alice-job", 1000, 2});
  ring.NoteGroup(2, {"bob-job", 1001, 2});
  const TraceEvent events[] = {At(10, 1), At(20, 2), At(30, 1), At(40, 3 /* unknown group */)};
  ring.Append(events);
  EXPECT_EQ(ring.Window(0, 100, -1, "").events.size(), 3u);  // unknown owner: never shown
  EXPECT_EQ(ring.Window(15, 35, -1, "").events.size(), 2u);
  const TraceSnapshot alice = ring.Window(0, 100, 1000, "");
  ASSERT_EQ(alice.events.size(), 2u);
  EXPECT_EQ(alice.groups.size(), 1u);
  EXPECT_EQ(alice.groups.at(1).job_id, "alice-job");
  EXPECT_EQ(ring.Window(0, 100, -1, "bob-job").events.size(), 1u);
  EXPECT_TRUE(ring.Window(0, 100, 1000, "bob-job").events.empty());
}

}  // namespace
}  // namespace hsdp
