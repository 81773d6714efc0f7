// hsdp-gpu-bench: the NCCL engine on real GPUs, against raw NCCL calls made
// in the same process and the same run (the baseline). For each size it runs
// all-reduce (default-priority stream) and all-gather / reduce-scatter
// (high-priority streams) over one rank per visible GPU and prints time per
// op, bus bandwidth (nccl-tests convention) and engine/raw ratio. The
// engine path includes what the daemon adds per op: the group call over
// every local rank, events recorded and polled, the launcher thread.
//
//   hsdp-gpu-bench [--sizes-mb 1,16,64,256] [--iters N] [--members N (2; 0: none)]
// With --members N >= 2, then N members on GPU 0 through the engine's
// intra-device path, fused and through scratch, beside a device copy.
// Exit code 2 when no GPU is visible (the message says why).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "daemon/device/cuda_device_api.h"
#include "daemon/engine/nccl/nccl_collectives.h"
#include "daemon/engine/nccl/nccl_library.h"
#include "daemon/engine/nccl/nccl_engine.h"

using namespace hsdp;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool WaitEvents(device::DeviceApi& dev, const std::vector<device::EventHandle>& evs) {
  for (;;) {
    bool all = true;
    for (auto e : evs) {
      auto d = dev.EventDone(e);
      if (!d.ok()) return false;
      all = all && *d;
    }
    if (all) return true;
  }
}

// Launches `t` on `engine` and waits for it; whether it succeeded.
bool RunTask(nccl::NcclEngine& engine, const EngineTask& t) {
  std::promise<absl::Status> p;
  EngineCallbacks cb;
  cb.launched = [](uint64_t) {};
  cb.completed = [&p](absl::Status s, uint64_t) { p.set_value(s); };
  engine.Launch(t, cb);
  return p.get_future().get().ok();
}

// Several members on one GPU (trainers sharing it): the engine's intra-device
// reduction, fused (straight into the outputs) and through scratch and copies,
// against a device copy of the same bytes, same process.
int SharedDevice(device::DeviceApi& dev, nccl::Collectives& coll, int members,
                 const std::vector<double>& sizes_mb, int iters) {
  nccl::NcclEngine fused(&dev, &coll);
  nccl::NcclEngineOptions o;
  o.fuse_shared_reduce = false;
  nccl::NcclEngine scratch(&dev, &coll, o);
  auto stream = dev.CreateStream(0, device::StreamPriority::kDefault);
  auto ev = dev.CreateEvent(0, false);
  if (!stream.ok() || !ev.ok()) return 1;
  std::printf("\n%d members on GPU 0 (in place; GB/s = one member's bytes / time)\n", members);
  std::printf("%-15s %10s %10s %10s %12s %10s %10s %10s\n", "op", "bytes", "copy_us", "fused_us",
              "scratch_us", "copy_GB/s", "fused_GB/s", "x_copy");
  int failures = 0;
  for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter}) {
    for (double mb : sizes_mb) {
      const uint64_t bytes = static_cast<uint64_t>(mb * (1 << 20)) / 4 * 4;
      const bool rs = c == Collective::kReduceScatter;
      const uint64_t count = rs ? bytes / 4 / members : bytes / 4;
      if (count == 0) continue;
      std::vector<device::DevicePtr> buf(members);
      for (auto& b : buf) b = *dev.Allocate(0, bytes);
      device::DevicePtr copy_dst = *dev.Allocate(0, bytes);
      EngineTask t;
      t.collective = c;
      t.count = count;
      t.group_key = rs ? "shared_rs" : "shared_ar";
      t.spec.dtype = DataType::kFloat32;
      for (int r = 0; r < members; ++r) {
        EngineMember m;
        m.global_rank = r;
        m.send = BufferView{MemoryKind::kDevice, 0, reinterpret_cast<void*>(buf[r]), bytes};
        const uint64_t off = rs ? uint64_t(r) * count * 4 : 0;
        m.recv = BufferView{MemoryKind::kDevice, 0, reinterpret_cast<void*>(buf[r] + off),
                            rs ? count * 4 : bytes};
        t.members.push_back(m);
      }
      auto once = [&](nccl::NcclEngine& e) { return RunTask(e, t); };
      auto copy_once = [&]() {
        return dev.MemcpyAsync(copy_dst, buf[0], bytes, *stream).ok() &&
               dev.RecordEvent(*ev, *stream).ok() && WaitEvents(dev, {*ev});
      };
      bool ok = copy_once() && once(fused) && once(scratch);
      auto time = [&](auto&& f) {
        const double t0 = Now();
        for (int i = 0; i < iters && ok; ++i) ok = f();
        return (Now() - t0) / iters;
      };
      const double cp = time(copy_once);
      const double fu = time([&]() { return once(fused); });
      const double sc = time([&]() { return once(scratch); });
      if (!ok) ++failures;
      std::printf("%-15s %10llu %10.1f %10.1f %12.1f %10.2f %10.2f %10.2f%s\n",
                  rs ? "reduce_scatter" : "all_reduce", (unsigned long long)bytes, cp * 1e6,
                  fu * 1e6, sc * 1e6, bytes / cp / 1e9, bytes / fu / 1e9, cp / fu,
                  ok ? "" : "  FAILED");
      for (auto b : buf) (void)dev.Free(b);
      (void)dev.Free(copy_dst);
    }
  }
  if (fused.stats().fused_shared_reduces == 0) {
    std::printf("the fused path never ran\n");
    ++failures;
  }
  fused.Shutdown();
  scratch.Shutdown();
  dev.DestroyEvent(*ev);
  dev.DestroyStream(*stream);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes_mb = {1, 16, 64, 256};
  int iters = 20;
  int members = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes-mb" && i + 1 < argc) {
      sizes_mb.clear();
      for (auto s : absl::StrSplit(argv[++i], ',')) {
        double v;
        if (absl::SimpleAtod(s, &v)) sizes_mb.push_back(v);
      }
    } else if (a == "--members" && i + 1 < argc) {
      members = std::atoi(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: hsdp-gpu-bench [--sizes-mb 1,16,64] [--iters N] [--members N]\n");
      return 1;
    }
  }
  auto dev = device::CudaDeviceApi::Create();
  if (dev->DeviceCount() == 0) {
    std::printf("hsdp-gpu-bench: no GPU (%s)\n", dev->unavailable_reason().c_str());
    return 2;
  }
  const int n = dev->DeviceCount();
  auto nccl_lib = nccl::NcclLibrary::Default();
  if (!nccl_lib.ok()) {
    std::printf("hsdp-gpu-bench: %s\n", std::string(nccl_lib.status().message()).c_str());
    return 2;
  }
  nccl::NcclCollectives coll(*nccl_lib);
  std::printf("hsdp-gpu-bench: %d GPU rank(s), %s, %d iterations per point\n", n,
              coll.name().c_str(), iters);
  std::printf("%-15s %10s %12s %12s %14s %10s %10s %7s\n", "op", "bytes", "raw_us", "engine_us",
              "eng_sleep_us", "raw_GB/s", "eng_GB/s", "ratio");
  // Raw baseline: one communicator set, streams, a group call per op.
  auto id = coll.NewUniqueId();
  std::vector<int> ranks(n), devs(n);
  for (int r = 0; r < n; ++r) ranks[r] = devs[r] = r;
  auto comms = coll.InitRanks(*id, n, ranks, devs);
  if (!comms.ok()) {
    std::printf("init failed: %s\n", std::string(comms.status().message()).c_str());
    return 1;
  }
  for (auto c : *comms) {
    absl::Status err;
    while (coll.Query(c, &err) == nccl::AsyncState::kInProgress) {
    }
  }
  std::vector<device::StreamHandle> streams(n);
  std::vector<device::EventHandle> events(n);
  for (int r = 0; r < n; ++r) {
    streams[r] = *dev->CreateStream(r, device::StreamPriority::kDefault);
    events[r] = *dev->CreateEvent(r, false);
  }
  nccl::NcclEngine engine(dev.get(), &coll);  // the daemon's options (spin window)
  nccl::NcclEngineOptions sleeping;
  sleeping.spin_window = absl::ZeroDuration();  // every poll a 50 us sleep (no spin window)
  nccl::NcclEngine engine_sleep(dev.get(), &coll, sleeping);
  int failures = 0;
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
    for (double mb : sizes_mb) {
      const uint64_t bytes = static_cast<uint64_t>(mb * (1 << 20)) / 4 * 4;
      const uint64_t total = bytes;  // the full buffer (nccl-tests "size")
      const uint64_t count = c == Collective::kAllReduce ? total / 4 : total / 4 / n;
      std::vector<device::DevicePtr> send(n), recv(n);
      for (int r = 0; r < n; ++r) {
        send[r] = *dev->Allocate(r, total);
        recv[r] = *dev->Allocate(r, total);
      }
      auto raw_once = [&]() {
        (void)coll.GroupStart();
        for (int r = 0; r < n; ++r) {
          if (c == Collective::kAllReduce) {
            (void)coll.AllReduce(send[r], recv[r], count, DataType::kFloat32, nccl::RedOp{},
                                 (*comms)[r], streams[r]);
          } else if (c == Collective::kAllGather) {
            (void)coll.AllGather(send[r], recv[r], count, DataType::kFloat32, (*comms)[r], streams[r]);
          } else {
            (void)coll.ReduceScatter(send[r], recv[r], count, DataType::kFloat32, nccl::RedOp{},
                                     (*comms)[r], streams[r]);
          }
        }
        (void)coll.GroupEnd();
        for (int r = 0; r < n; ++r) (void)dev->RecordEvent(events[r], streams[r]);
        return WaitEvents(*dev, events);
      };
      EngineTask t;
      t.collective = c;
      t.count = count;
      t.group_key = "bench";
      t.spec.dtype = DataType::kFloat32;
      for (int r = 0; r < n; ++r) {
        EngineMember m;
        m.global_rank = r;
        m.send = BufferView{MemoryKind::kDevice, r, reinterpret_cast<void*>(send[r]), total};
        m.recv = BufferView{MemoryKind::kDevice, r, reinterpret_cast<void*>(recv[r]), total};
        t.members.push_back(m);
      }
      auto engine_once = [&](nccl::NcclEngine& engine) { return RunTask(engine, t); };
      bool ok = raw_once() && engine_once(engine) && engine_once(engine_sleep);  // warm-up, comm init
      double t0 = Now();
      for (int i = 0; i < iters && ok; ++i) ok = raw_once();
      const double raw = (Now() - t0) / iters;
      t0 = Now();
      for (int i = 0; i < iters && ok; ++i) ok = engine_once(engine);
      const double eng = (Now() - t0) / iters;
      t0 = Now();
      for (int i = 0; i < iters && ok; ++i) ok = engine_once(engine_sleep);
      const double eng_sleep = (Now() - t0) / iters;
      if (!ok) ++failures;
      const double factor = c == Collective::kAllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
      const double bw_raw = n > 1 ? total * factor / raw / 1e9 : total / raw / 1e9;
      const double bw_eng = n > 1 ? total * factor / eng / 1e9 : total / eng / 1e9;
      std::printf("%-15s %10llu %12.1f %12.1f %14.1f %10.2f %10.2f %7.2f%s\n",
                  c == Collective::kAllReduce ? "all_reduce"
                  : c == Collective::kAllGather ? "all_gather" : "reduce_scatter",
                  (unsigned long long)total, raw * 1e6, eng * 1e6, eng_sleep * 1e6, bw_raw, bw_eng, eng / raw,
                  ok ? "" : "  FAILED");
      for (int r = 0; r < n; ++r) {
        (void)dev->Free(send[r]);
        (void)dev->Free(recv[r]);
      }
    }
  }
  engine.Shutdown();
  engine_sleep.Shutdown();
  if (members >= 2) failures += SharedDevice(*dev, coll, members, sizes_mb, iters);
  (void)coll.Release(*comms, /*abort=*/false);  // one group call for every local rank
  return failures == 0 ? 0 : 1;
}
