// hsdp-cluster-engine-bench: the cross-node engine over the real Gloo TCP
// transport on loopback, next to plain Gloo on the same data in the same run.
//
// Topology: --nodes simulated daemons (default 2) in this process, each a
// HierarchicalEngine over a CpuEngine hosting --per-node ranks (default 2),
// so the group has nodes x per-node ranks. The baseline is what torch's Gloo
// backend runs for the same group: one gloo context per rank (each with its
// own tcp device, as one process per rank would have), gloo::allreduce
// (ring) and gloo::allgather, one thread per rank.
//
// For every size (bytes per rank: 1, 4, 16, 64 MiB by default) it prints the
// median time per operation over --iters iterations (3 alternating rounds of
// each side, so that both see the same machine load) and the bus bandwidth,
// nccl-tests style: all-reduce 2(n-1)/n x bytes / t, all-gather (n-1)/n x
// output bytes / t. The two sides never run at the same time.
//
// Usage: hsdp-cluster-engine-bench [--nodes N] [--per-node L] [--iters I]
//                                  [--sizes-mb 1,4,16,64] [--chunk-kb K] [--devices D]
//                                  [--baseline 0|1] [--local-threads T]
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "daemon/engine/cpu/cpu_engine.h"
#include "daemon/engine/crossnode/gloo_transport.h"
#include "daemon/engine/crossnode/hierarchical_engine.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "tests/common/gloo_store.h"  // PrefixedStores

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int nodes = 2;
  int per_node = 2;
  int iters = 10;
  std::vector<size_t> sizes_mb = {1, 4, 16, 64};
  size_t chunk_kb = 4096;
  int devices = 1;
  int local_threads = 1;
  bool baseline = true;
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--nodes") f.nodes = std::max(2, std::atoi(v.c_str()));
    else if (k == "--per-node") f.per_node = std::max(1, std::atoi(v.c_str()));
    else if (k == "--iters") f.iters = std::max(1, std::atoi(v.c_str()));
    else if (k == "--chunk-kb") f.chunk_kb = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--devices") f.devices = std::max(1, std::atoi(v.c_str()));
    else if (k == "--baseline") f.baseline = std::atoi(v.c_str()) != 0;
    else if (k == "--local-threads") f.local_threads = std::max(1, std::atoi(v.c_str()));
    else if (k == "--sizes-mb") {
      f.sizes_mb.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        f.sizes_mb.push_back(std::strtoull(std::string(s).c_str(), nullptr, 10));
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --- hsdpd's cross-node engine ------------------------------------------------

class EngineSide {
 public:
  EngineSide(const Flags& f) : f_(f) {
    auto store = std::make_shared<gloo::rendezvous::HashStore>();
    hsdp::HierarchicalEngineOptions o;
    o.threads = 2;
    o.timeout = absl::Seconds(120);
    o.chunk_bytes = f.chunk_kb << 10;
    o.local_threads = f.local_threads;
    for (int n = 0; n < f.nodes; ++n) {
      hsdp::GlooTransportOptions t;
      t.data_address = "127.0.0.1";
      t.devices = f.devices;
      t.store = hsdp::testing::PrefixedStores(store);
      engines_.push_back(hsdp::MakeHierarchicalEngine(
          std::make_unique<hsdp::CpuEngine>(1, 1 << 20), hsdp::MakeGlooTransport(std::move(t)),
          o));
    }
  }

  // Seconds per operation (median).
  // Times of `iters` operations after one warm-up (which connects).
  std::vector<double> Time(hsdp::Collective c, size_t bytes, std::vector<std::vector<float>>& in,
                           std::vector<std::vector<float>>& out, int iters) {
    std::vector<double> times;
    for (int it = -1; it < iters; ++it) {
      const auto start = Clock::now();
      Run(c, bytes, in, out);
      if (it >= 0) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    return times;
  }

 private:
  void Run(hsdp::Collective c, size_t bytes, std::vector<std::vector<float>>& in,
           std::vector<std::vector<float>>& out) {
    const int n = f_.nodes * f_.per_node;
    const uint64_t count = bytes / sizeof(float);
    std::mutex mu;
    std::condition_variable cv;
    int left = f_.nodes;
    bool failed = false;
    ++seq_;
    for (int node = 0; node < f_.nodes; ++node) {
      hsdp::EngineTask t;
      t.collective = c;
      t.spec.dtype = hsdp::DataType::kFloat32;
      t.count = count;
      t.group_key = c == hsdp::Collective::kAllReduce ? "bench-ar" : "bench-ag";
      t.seq = seq_;
      for (int r = 0; r < n; ++r) {
        hsdp::EngineMember m;
        m.global_rank = r;
        m.node = r / f_.per_node;
        m.local = m.node == node;
        if (m.local) {
          m.send = {hsdp::MemoryKind::kHost, -1, in[r].data(), count * 4};
          m.recv = {hsdp::MemoryKind::kHost, -1, out[r].data(), out[r].size() * 4};
        }
        t.members.push_back(m);
      }
      hsdp::EngineCallbacks cb;
      cb.launched = [](uint64_t) {};
      cb.completed = [&](absl::Status s, uint64_t) {
        std::lock_guard<std::mutex> l(mu);
        if (!s.ok()) {
          std::fprintf(stderr, "engine: %s\n", s.ToString().c_str());
          failed = true;
        }
        --left;
        cv.notify_all();
      };
      engines_[node]->Launch(std::move(t), std::move(cb));
    }
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return left == 0; });
    if (failed) std::exit(1);
  }

  const Flags f_;
  std::vector<std::unique_ptr<hsdp::Engine>> engines_;
  uint64_t seq_ = 0;
};

// --- plain Gloo, one context per rank ------------------------------------------

class GlooSide {
 public:
  explicit GlooSide(const Flags& f) : n_(f.nodes * f.per_node) {
    auto store = std::make_shared<gloo::rendezvous::HashStore>();
    contexts_.resize(n_);
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r) {
      threads.emplace_back([&, r] {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, n_);
        ctx->setTimeout(std::chrono::seconds(120));
        gloo::rendezvous::PrefixStore ps("baseline", *store);
        ctx->connectFullMesh(ps, dev);
        contexts_[r] = ctx;
      });
    }
    for (auto& t : threads) t.join();
  }

  std::vector<double> Time(bool allreduce, size_t bytes, std::vector<std::vector<float>>& in,
                           std::vector<std::vector<float>>& out, int iters) {
    const size_t count = bytes / sizeof(float);
    std::vector<double> times;
    std::barrier sync(n_ + 1);
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r) {
      threads.emplace_back([&, r] {
        for (int it = -1; it < iters; ++it) {
          sync.arrive_and_wait();
          if (allreduce) {
            std::memcpy(out[r].data(), in[r].data(), bytes);  // torch reduces in place
            gloo::AllreduceOptions o(contexts_[r]);
            o.setOutput(out[r].data(), count);
            o.setReduceFunction(
                static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
            o.setTag(static_cast<uint32_t>(++tags_[r]));
            gloo::allreduce(o);
          } else {
            gloo::AllgatherOptions o(contexts_[r]);
            o.setInput(in[r].data(), count);
            o.setOutput(out[r].data(), count * n_);
            o.setTag(static_cast<uint32_t>(++tags_[r]));
            gloo::allgather(o);
          }
          sync.arrive_and_wait();
        }
      });
    }
    for (int it = -1; it < iters; ++it) {
      sync.arrive_and_wait();
      const auto start = Clock::now();
      sync.arrive_and_wait();
      if (it >= 0) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    for (auto& t : threads) t.join();
    return times;
  }

 private:
  const int n_;
  std::vector<std::shared_ptr<gloo::Context>> contexts_;
  std::vector<uint64_t> tags_ = std::vector<uint64_t>(64, 0);
};

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  const int n = f.nodes * f.per_node;
  EngineSide engine(f);
  std::unique_ptr<GlooSide> gloo_side;
  if (f.baseline) gloo_side = std::make_unique<GlooSide>(f);
  std::printf("# %d nodes x %d ranks = %d ranks, loopback TCP, float32, chunk %zu KiB, "
              "%d Gloo devices per node, median of %d\n",
              f.nodes, f.per_node, n, f.chunk_kb, f.devices, f.iters);
  std::printf("%-10s %8s %12s %12s %12s %12s %8s\n", "op", "MiB", "hsdpd ms", "hsdpd GB/s",
              "gloo ms", "gloo GB/s", "ratio");
  for (bool allreduce : {true, false}) {
    for (size_t mb : f.sizes_mb) {
      const size_t bytes = mb << 20;
      const size_t out_elems = (allreduce ? bytes : bytes * n) / sizeof(float);
      std::vector<std::vector<float>> in(n), out(n);
      for (int r = 0; r < n; ++r) {
        in[r].assign(bytes / sizeof(float), float(r + 1));
        out[r].assign(out_elems, 0.0f);
      }
      // Alternating rounds, so that both sides see the same machine load.
      const hsdp::Collective c =
          allreduce ? hsdp::Collective::kAllReduce : hsdp::Collective::kAllGather;
      std::vector<double> engine_times, gloo_times;
      const int rounds = 3, per_round = std::max(1, f.iters / rounds);
      for (int round = 0; round < rounds; ++round) {
        for (double t : engine.Time(c, bytes, in, out, per_round)) engine_times.push_back(t);
        if (gloo_side != nullptr) {
          for (double t : gloo_side->Time(allreduce, bytes, in, out, per_round)) {
            gloo_times.push_back(t);
          }
        }
      }
      const double te = Median(engine_times);
      const double tg = gloo_times.empty() ? 1e30 : Median(gloo_times);
      const double factor = allreduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
      const double moved = allreduce ? double(bytes) : double(bytes) * n;
      const double be = factor * moved / te / 1e9, bg = factor * moved / tg / 1e9;
      std::printf("%-10s %8zu %12.2f %12.2f %12.2f %12.2f %8.2f\n",
                  allreduce ? "allreduce" : "allgather", mb, te * 1e3, be, tg * 1e3, bg,
                  be / bg);
      std::fflush(stdout);
    }
  }
  return 0;
}
