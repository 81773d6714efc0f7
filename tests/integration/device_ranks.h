// The trainer ranks of the device-memory integration tests and their checks:
// one forked process per rank, waiting on a submitted operation, comparing a
// result with its reference, every collective of two ranks, and the HSDP
// composite on a 2x2 mesh checked against the sum of the four inputs. A failed check is reported through the
// trainer (DeviceTrainer::Fail), so the rank's exit code and output carry it.
#ifndef HSDP_TESTS_INTEGRATION_DEVICE_RANKS_H_
#define HSDP_TESTS_INTEGRATION_DEVICE_RANKS_H_

#include <algorithm>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device_fake_util.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "test_util.h"

namespace hsdp::testing {

// Rank `rank`'s input element `i`: distinct per rank, exact in float32.
inline float In(int rank, uint64_t i) { return float(rank * 1000 + int(i % 997) + 1); }

// Runs `body(rank, out)` in `world` forked processes and expects each to
// exit 0 within `timeout_ms` (its output is in the failure message).
inline void RunRanks(int world, const std::function<int(int, FILE*)>& body,
                     int timeout_ms = 120000) {
  std::vector<std::unique_ptr<Child>> kids;
  for (int r = 0; r < world; ++r) {
    kids.push_back(std::make_unique<Child>([&body, r](FILE* out) { return body(r, out); }));
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(kids[r]->Finish(timeout_ms), 0) << "rank " << r << ":\n" << kids[r]->output();
  }
}

// True when `w` was submitted and completed OK within 30 s.
inline bool Await(DeviceTrainer* T, absl::StatusOr<Work> w, const std::string& name) {
  if (!w.ok()) return T->Fail(name + ": submit: " + w.status().ToString()), false;
  if (absl::Status s = w->Wait(absl::Seconds(30)); !s.ok()) {
    return T->Fail(name + ": " + s.ToString()), false;
  }
  return true;
}

// Fails `name` at the first of `n` elements that differs from `want(i)`.
inline void Expect(DeviceTrainer* T, const std::string& name, const float* got, uint64_t n,
                   const std::function<float(uint64_t)>& want) {
  for (uint64_t i = 0; i < n; ++i) {
    if (got[i] != want(i)) {
      T->Fail(name + ": [" + std::to_string(i) + "] got " + std::to_string(got[i]) + ", want " +
              std::to_string(want(i)));
      return;
    }
  }
}

// Every collective of the two ranks of `g` (rank 0 and 1) from the trainer's
// buffer at 0 (2 x `count` floats of In, refilled before each) to
// `recv_offset`: all-reduce under each of `all_reduce_ops` (sum, avg, max),
// in place, all-gather, reduce-scatter, broadcast from rank 1 and all-to-all,
// each checked against its reference.
inline void CheckEveryCollective2(DeviceTrainer* T, const Group& g, uint64_t count,
                                  uint64_t recv_offset,
                                  std::initializer_list<ReduceOp> all_reduce_ops) {
  constexpr int kWorld = 2;
  const int rank = T->rank;
  const BufferRef send{T->buffer, 0}, recv{T->buffer, recv_offset};
  auto fill = [&] {
    for (uint64_t i = 0; i < count * kWorld; ++i) T->F(0)[i] = In(rank, i);
  };
  for (ReduceOp op : all_reduce_ops) {
    fill();
    ReduceOptions o;
    o.op = op;
    if (!Await(T, T->client->AllReduce(g, send, recv, count, DataType::kFloat32, o),
               "all_reduce")) {
      continue;
    }
    Expect(T, "all_reduce", T->F(recv_offset), count, [&](uint64_t i) {
      const float s = In(0, i) + In(1, i);
      return op == ReduceOp::kSum   ? s
             : op == ReduceOp::kAvg ? s / 2
                                    : std::max(In(0, i), In(1, i));
    });
  }
  fill();
  if (Await(T, T->client->AllReduce(g, send, send, count, DataType::kFloat32), "in place")) {
    Expect(T, "all_reduce in place", T->F(0), count,
           [](uint64_t i) { return In(0, i) + In(1, i); });
  }
  // Rank r's `count` elements land at recv + r * count.
  fill();
  if (Await(T, T->client->AllGather(g, send, recv, count, DataType::kFloat32), "all_gather")) {
    Expect(T, "all_gather", T->F(recv_offset), count * kWorld,
           [&](uint64_t i) { return In(int(i / count), i % count); });
  }
  // Rank r gets slice r of the sum.
  fill();
  if (Await(T, T->client->ReduceScatter(g, send, recv, count, DataType::kFloat32),
            "reduce_scatter")) {
    Expect(T, "reduce_scatter", T->F(recv_offset), count, [&](uint64_t i) {
      return In(0, rank * count + i) + In(1, rank * count + i);
    });
  }
  fill();
  if (Await(T, T->client->Broadcast(g, send, recv, count, DataType::kFloat32, 1), "broadcast")) {
    Expect(T, "broadcast", T->F(recv_offset), count, [](uint64_t i) { return In(1, i); });
  }
  // Equal blocks: block j of rank i lands at rank j's recv + i * count.
  fill();
  if (Await(T, T->client->AllToAll(g, send, recv, count, DataType::kFloat32), "all_to_all")) {
    Expect(T, "all_to_all", T->F(recv_offset), count * kWorld, [&](uint64_t i) {
      return In(int(i / count), rank * count + i % count);
    });
  }
}

// The HSDP composite of world 4 (reduce-scatter in the shard group
// {2r, 2r+1}, all-reduce across the replicate group {s, s+2}), sum and
// average, from the trainer's buffer at 0 (2 x `count` floats of In) to
// `recv_offset`: each rank holds its shard of the sum (or average) of the
// four inputs. False when the groups could not be made.
inline bool CheckHsdpComposite2x2(DeviceTrainer* T, uint64_t count, uint64_t recv_offset) {
  const int replica = T->rank / 2, shard_rank = T->rank % 2;
  auto shard = T->client->NewGroup({replica * 2, replica * 2 + 1});
  auto replicate = T->client->NewGroup({shard_rank, shard_rank + 2});
  if (!shard.ok() || !replicate.ok()) return T->Fail("NewGroup"), false;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    for (uint64_t i = 0; i < 2 * count; ++i) T->F(0)[i] = In(T->rank, i);
    ReduceOptions o;
    o.op = op;
    if (!Await(T,
               T->client->ReduceScatterAllReduce(*shard, *replicate, {T->buffer, 0},
                                                 {T->buffer, recv_offset}, count,
                                                 DataType::kFloat32, o),
               "rs+ar")) {
      continue;
    }
    Expect(T, op == ReduceOp::kSum ? "rs+ar sum" : "rs+ar avg", T->F(recv_offset), count,
           [&](uint64_t i) {
             const uint64_t k = shard_rank * count + i;
             const float sum = In(0, k) + In(1, k) + In(2, k) + In(3, k);
             return op == ReduceOp::kSum ? sum : sum / 4;
           });
  }
  return true;
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_DEVICE_RANKS_H_
