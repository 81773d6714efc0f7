// hsdp-bench: collective benchmarks through hsdpd in the nccl-tests format.
//
//   hsdp-bench [--op all_reduce|all_gather|reduce_scatter|broadcast|barrier|
//                    reduce_scatter_all_reduce]
//              [--nranks N] [--nodes K] [--min-bytes 4K] [--max-bytes 64M] [--step-factor 2]
//              [--dtype float32] [--redop sum] [--iters 20] [--warmup 5]
//              [--inplace] [--check] [--json] [--socket PATH | --sockets P0,P1,...]
//              [--node-config FILE] [--stamps DIR]
//
// Spawns N rank processes per node. With one node (the default) they attach
// to its own hsdpd, or to the one --socket names. With --nodes K > 1 it
// starts K daemons forming a cluster on loopback (bench_cluster.h; node 0 the
// coordinator), or uses the existing daemons --sockets names (one per node,
// K = their number), and attaches ranks k*N .. k*N+N-1 to node k's daemon:
// the world has K*N ranks. --node-config is passed to the daemons it spawns
// (with --nodes, it must not have a `cluster:` section).
//
// "size" is the total buffer size as in nccl-tests (the gathered output for
// all-gather, the full input for reduce-scatter and for the composite);
// busbw uses the nccl-tests factors with n = the world size: all-reduce
// 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, broadcast 1.
//
// reduce_scatter_all_reduce (alias composite) is the HSDP gradient op as ONE
// submission (Client::ReduceScatterAllReduce): a 2-D mesh whose shard group
// is the N ranks of a node and whose replicate group is the K ranks with the
// same local index on every node; reduce-scatter of `size` bytes in the
// shard group, then all-reduce of the size/N shard in the replicate group.
// Its busbw factor is the sum of the two phases' nccl-tests bus bytes over
// `size`: (N-1)/N + 2(K-1)/(K N) (1.0 for 2 x 2).
//
// time(us) is the mean over --iters, p50(us) the median, p99(us) the 99th
// percentile; every iteration starts after a barrier of the whole world.
// --stamps DIR: each rank writes DIR/rank<r>.txt, one line per timed
// iteration: "<size> <submit> <done>" in CLOCK_MONOTONIC nanoseconds (the
// daemon's trace clock), for tools/bench/latency_breakdown.py.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_cluster.h"
#include "bench_util.h"
#include "hsdp/client.h"
#include "../../tests/common/reduce_reference.h"  // Combine; hsdp-bench has no root include path

namespace {

using hsdp::Collective;
using hsdp::DataType;

struct Options {
  Collective op = Collective::kAllReduce;
  int nranks = 2;  // per node
  int nodes = 1;
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  double step = 2;
  DataType dtype = DataType::kFloat32;
  hsdp::ReduceOp redop = hsdp::ReduceOp::kSum;
  int iters = 20;
  int warmup = 5;
  bool inplace = false;
  bool check = false;
  bool json = false;
  std::string socket;
  std::vector<std::string> sockets;  // one per node (--sockets)
  std::string node_config;  // for the hsdpd(s) the benchmark spawns
  std::string stamps;       // --stamps DIR

  int world() const { return nodes * nranks; }
};

bool ParseSize(const std::string& s, uint64_t* out) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end;
  uint64_t mult = 1;
  if (unit == "K" || unit == "KB" || unit == "KiB") mult = 1024;
  else if (unit == "M" || unit == "MB" || unit == "MiB") mult = 1 << 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB") mult = 1 << 30;
  else if (!unit.empty()) return false;
  if (v <= 0) return false;
  *out = uint64_t(v * double(mult));
  return true;
}

int Usage(const char* why) {
  std::fprintf(stderr, "hsdp-bench: %s\n(see the comment at the top of tools/bench/hsdp_bench.cc)\n", why);
  return 2;
}

double BusFactor(const Options& o) {
  const int n = o.world();
  switch (o.op) {
    case Collective::kAllReduce: return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter: return double(n - 1) / n;
    case Collective::kReduceScatterAllReduce: {
      const double s = o.nranks, r = o.nodes;
      return (s - 1) / s + 2 * (r - 1) / (r * s);
    }
    default: return 1.0;
  }
}

// Ranks that split the input: the shard group for the composite, else the world.
int ScatterWidth(const Options& o) {
  return o.op == Collective::kReduceScatterAllReduce ? o.nranks : o.world();
}

// Expected value of element `i` of rank `r`'s output.
double Expected(const Options& o, int r, uint64_t i, uint64_t count) {
  const int n = o.world();
  auto reduce = [&](uint64_t idx) {
    double acc = hsdp::bench::PatternValue(0, idx);
    for (int k = 1; k < n; ++k) {
      acc = hsdp::testing::Combine(o.redop, acc, hsdp::bench::PatternValue(k, idx));
    }
    if (o.redop == hsdp::ReduceOp::kAvg) acc /= n;
    return acc;
  };
  switch (o.op) {
    case Collective::kAllReduce: return reduce(i);
    case Collective::kReduceScatter: return reduce(uint64_t(r) * count + i);
    // Every rank of the mesh, at this rank's shard position.
    case Collective::kReduceScatterAllReduce: return reduce(uint64_t(r % o.nranks) * count + i);
    case Collective::kAllGather: return hsdp::bench::PatternValue(int(i / count), i % count);
    case Collective::kBroadcast: return hsdp::bench::PatternValue(0, i);
    default: return 0;
  }
}

std::vector<int> Range(int begin, int n, int stride) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = begin + i * stride;
  return v;
}

int Fail(int rank, const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what.c_str(), s.ToString().c_str());
  return 1;
}

// One rank: returns the process exit code.
int RunRank(const Options& o, int rank, const std::string& job, const std::string& socket) {
  hsdp::ClientOptions co;
  co.socket_path = socket;
  co.job_id = job;
  co.rank = rank;
  co.world_size = o.world();
  auto client = hsdp::Client::Connect(co);
  if (!client.ok()) return Fail(rank, "connect to " + socket, client.status());
  hsdp::Client& c = **client;
  auto group = c.NewGroup(Range(0, o.world(), 1));
  if (!group.ok()) return Fail(rank, "NewGroup", group.status());
  // The HSDP mesh: shard = this node's ranks, replicate = same local index.
  hsdp::Group shard, replicate;
  const bool composite = o.op == Collective::kReduceScatterAllReduce;
  if (composite) {
    auto s = c.NewGroup(Range(rank - rank % o.nranks, o.nranks, 1));
    if (!s.ok()) return Fail(rank, "NewGroup(shard)", s.status());
    auto r = c.NewGroup(Range(rank % o.nranks, o.nodes, o.nranks));
    if (!r.ok()) return Fail(rank, "NewGroup(replicate)", r.status());
    shard = *s;
    replicate = *r;
  }
  const size_t es = hsdp::DataTypeSize(o.dtype);
  const uint64_t max_total = std::max<uint64_t>(o.max_bytes, es * o.world());
  auto sendbuf = c.AllocateBuffer(max_total, "bench-send");
  auto recvbuf = c.AllocateBuffer(max_total, "bench-recv");
  if (!sendbuf.ok() || !recvbuf.ok()) {
    return Fail(rank, "allocate", !sendbuf.ok() ? sendbuf.status() : recvbuf.status());
  }
  if (rank == 0 && !o.json) {
    // One node: the header of the single-node benchmark, unchanged.
    const std::string where = o.nodes == 1 ? std::to_string(o.nranks) + " ranks"
                                           : std::to_string(o.nodes) + " nodes x " +
                                                 std::to_string(o.nranks) + " ranks";
    const std::string factor =
        o.nodes == 1 && !composite ? "" : ", busbw factor " + std::to_string(BusFactor(o));
    std::printf("# hsdp-bench %s, %s, dtype %s, redop %s, %s, iters %d, warmup %d%s\n",
                std::string(hsdp::CollectiveName(o.op)).c_str(), where.c_str(),
                std::string(hsdp::DataTypeName(o.dtype)).c_str(),
                std::string(hsdp::ReduceOpName(o.redop)).c_str(),
                o.inplace ? "in-place" : "out-of-place", o.iters, o.warmup, factor.c_str());
    std::printf("%12s %12s %9s %8s %10s %10s %10s %8s %10s %10s\n", "size(B)", "count", "type", "redop",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "p50(us)", "p99(us)");
  }
  if (rank == 0 && o.json) std::printf("[");
  bool first_row = true;
  int exit_code = 0;
  std::unique_ptr<FILE, int (*)(FILE*)> stamps_file(nullptr, &std::fclose);
  if (!o.stamps.empty()) {
    const std::string path = o.stamps + "/rank" + std::to_string(rank) + ".txt";
    stamps_file.reset(std::fopen(path.c_str(), "w"));
    if (stamps_file == nullptr) {
      std::fprintf(stderr, "rank %d: cannot write %s: %s\n", rank, path.c_str(),
                   std::strerror(errno));
      return 1;
    }
  }
  FILE* const stamps = stamps_file.get();
  const int width = ScatterWidth(o);
  // This rank's position in the group that scatters (the output slice it owns).
  const int slot = composite ? rank % o.nranks : rank;
  for (uint64_t size = o.min_bytes; size <= o.max_bytes;
       size = std::max<uint64_t>(size + 1, uint64_t(double(size) * o.step))) {
    // count: elements per rank as the client API takes them.
    uint64_t total = size / es;
    uint64_t count = total;
    const bool scatters = o.op == Collective::kAllGather || o.op == Collective::kReduceScatter ||
                          composite;
    if (scatters) count = total / width;
    if (o.op != Collective::kBarrier && count == 0) continue;
    if (scatters) total = count * width;
    const uint64_t bytes = total * es;
    // Input layout; in-place puts this rank's slice where the collective expects it.
    hsdp::BufferRef send{sendbuf->id, 0}, recv{recvbuf->id, 0};
    char* in = static_cast<char*>(sendbuf->data);
    const bool full_input = o.op == Collective::kReduceScatter || composite;
    uint64_t in_elems = full_input ? total : count;
    if (o.inplace) {
      recv = send;
      if (o.op == Collective::kAllGather) send.offset_bytes = uint64_t(slot) * count * es;
      if (full_input) recv.offset_bytes = uint64_t(slot) * count * es;
    }
    auto fill = [&] {
      char* base = in + send.offset_bytes;
      for (uint64_t i = 0; i < in_elems; ++i) {
        hsdp::bench::StoreAs(o.dtype, base, i, hsdp::bench::PatternValue(rank, i));
      }
    };
    auto run_once = [&]() -> absl::Status {
      absl::StatusOr<hsdp::Work> w;
      hsdp::ReduceOptions ro;
      ro.op = o.redop;
      switch (o.op) {
        case Collective::kAllReduce: w = c.AllReduce(*group, send, recv, count, o.dtype, ro); break;
        case Collective::kAllGather: w = c.AllGather(*group, send, recv, count, o.dtype); break;
        case Collective::kReduceScatter: w = c.ReduceScatter(*group, send, recv, count, o.dtype, ro); break;
        case Collective::kReduceScatterAllReduce:
          w = c.ReduceScatterAllReduce(shard, replicate, send, recv, count, o.dtype, ro);
          break;
        case Collective::kBroadcast: w = c.Broadcast(*group, send, recv, count, o.dtype, 0); break;
        default: w = c.Barrier(*group);
      }
      if (!w.ok()) return w.status();
      return w->Wait();
    };
    fill();
    uint64_t wrong = 0;
    if (o.check) {
      absl::Status s = run_once();
      if (!s.ok()) return Fail(rank, "size " + std::to_string(bytes), s);
      const void* out_base = recv.buffer_id == sendbuf->id ? sendbuf->data : recvbuf->data;
      const char* out = static_cast<const char*>(out_base) + recv.offset_bytes;
      const uint64_t out_elems = (o.op == Collective::kAllGather) ? total : count;
      if (o.op != Collective::kBarrier) {
        for (uint64_t i = 0; i < out_elems; ++i) {
          if (hsdp::bench::LoadAs(o.dtype, out, i) != Expected(o, rank, i, count)) ++wrong;
        }
      }
      if (wrong > 0) exit_code = 3;
    }
    std::vector<double> times;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      if (o.inplace && o.check) fill();
      auto b = c.Barrier(*group);
      absl::Status bs = b.ok() ? b->Wait() : b.status();
      if (!bs.ok()) return Fail(rank, "barrier", bs);
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = run_once();
      const auto t1 = std::chrono::steady_clock::now();
      if (!s.ok()) return Fail(rank, "size " + std::to_string(bytes), s);
      if (it >= o.warmup) {
        times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        if (stamps != nullptr) {
          std::fprintf(stamps, "%llu %lld %lld\n", (unsigned long long)bytes,
                       (long long)std::chrono::nanoseconds(t0.time_since_epoch()).count(),
                       (long long)std::chrono::nanoseconds(t1.time_since_epoch()).count());
        }
      }
    }
    double mean = 0;
    for (double t : times) mean += t;
    mean /= double(times.size());
    std::sort(times.begin(), times.end());
    const double p50 = times[times.size() / 2];
    const double p99 = times[std::min(times.size() - 1, times.size() * 99 / 100)];
    const double algbw = double(bytes) / mean / 1e3;
    const double busbw = algbw * BusFactor(o);
    if (rank == 0) {
      if (o.json) {
        std::printf("%s\n  {\"op\": \"%s\", \"nodes\": %d, \"nranks\": %d, \"size\": %llu, "
                    "\"count\": %llu, \"type\": \"%s\", "
                    "\"redop\": \"%s\", \"time_us\": %.3f, \"p50_us\": %.3f, \"p99_us\": %.3f, "
                    "\"algbw_gbps\": %.4f, "
                    "\"busbw_gbps\": %.4f, \"wrong\": %llu}",
                    first_row ? "" : ",", std::string(hsdp::CollectiveName(o.op)).c_str(), o.nodes,
                    o.nranks, (unsigned long long)bytes, (unsigned long long)total,
                    std::string(hsdp::DataTypeName(o.dtype)).c_str(),
                    std::string(hsdp::ReduceOpName(o.redop)).c_str(), mean, p50, p99, algbw, busbw,
                    (unsigned long long)wrong);
      } else {
        std::printf("%12llu %12llu %9s %8s %10.2f %10.3f %10.3f %8s %10.2f %10.2f\n",
                    (unsigned long long)bytes, (unsigned long long)total,
                    std::string(hsdp::DataTypeName(o.dtype)).c_str(),
                    std::string(hsdp::ReduceOpName(o.redop)).c_str(), mean, algbw, busbw,
                    o.check ? std::to_string(wrong).c_str() : "N/A", p50, p99);
      }
      std::fflush(stdout);
    }
    if (wrong > 0) {
      std::fprintf(stderr, "rank %d: %llu wrong elements at size %llu\n", rank,
                   (unsigned long long)wrong, (unsigned long long)bytes);
    }
    first_row = false;
    if (o.op == Collective::kBarrier) break;
  }
  if (rank == 0 && o.json) std::printf("\n]\n");
  return exit_code;
}

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The contents of --node-config for a cluster; "" and *error set when unusable.
bool ReadExtraYaml(const std::string& path, std::string* yaml, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read --node-config " + path;
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  *yaml = ss.str();
  std::stringstream lines(*yaml);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("cluster:", 0) == 0) {
      *error = "--node-config must not have a cluster: section with --nodes (hsdp-bench writes it)";
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool nodes_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--op") {
      std::string v = next();
      if (v == "all_reduce" || v == "allreduce") o.op = Collective::kAllReduce;
      else if (v == "all_gather" || v == "allgather") o.op = Collective::kAllGather;
      else if (v == "reduce_scatter" || v == "reducescatter") o.op = Collective::kReduceScatter;
      else if (v == "broadcast") o.op = Collective::kBroadcast;
      else if (v == "barrier") o.op = Collective::kBarrier;
      else if (v == "reduce_scatter_all_reduce" || v == "composite") {
        o.op = Collective::kReduceScatterAllReduce;
      } else {
        return Usage(("unknown --op " + v).c_str());
      }
    } else if (a == "--nranks") {
      o.nranks = std::atoi(next().c_str());
      if (o.nranks < 1 || o.nranks > 64) return Usage("--nranks must be 1..64");
    } else if (a == "--nodes") {
      o.nodes = std::atoi(next().c_str());
      nodes_given = true;
      if (o.nodes < 1 || o.nodes > 16) return Usage("--nodes must be 1..16");
    } else if (a == "--min-bytes") {
      if (!ParseSize(next(), &o.min_bytes)) return Usage("bad --min-bytes");
    } else if (a == "--max-bytes") {
      if (!ParseSize(next(), &o.max_bytes)) return Usage("bad --max-bytes");
    } else if (a == "--step-factor") {
      o.step = std::atof(next().c_str());
      if (o.step <= 1) return Usage("--step-factor must be > 1");
    } else if (a == "--dtype") {
      o.dtype = hsdp::ParseDataType(next());
      if (o.dtype == DataType::kInvalid) return Usage("unknown --dtype");
    } else if (a == "--redop") {
      o.redop = hsdp::ParseReduceOp(next());
      if (o.redop == hsdp::ReduceOp::kInvalid || o.redop == hsdp::ReduceOp::kPremulSum) {
        return Usage("--redop must be sum, avg, min, max or product");
      }
    } else if (a == "--iters") {
      o.iters = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--warmup") {
      o.warmup = std::max(0, std::atoi(next().c_str()));
    } else if (a == "--inplace") {
      o.inplace = true;
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--stamps") {
      o.stamps = next();
    } else if (a == "--socket") {
      o.socket = next();
    } else if (a == "--sockets") {
      o.sockets = SplitCommas(next());
      if (o.sockets.empty()) return Usage("--sockets needs a comma-separated list");
    } else if (a == "--node-config") {
      o.node_config = next();
      if (o.node_config.empty() || o.node_config.find('\'') != std::string::npos) {
        return Usage("--node-config needs a file name without single quotes");
      }
    } else {
      return Usage(("unknown argument " + a).c_str());
    }
  }
  if (o.min_bytes > o.max_bytes) return Usage("--min-bytes > --max-bytes");
  if (!o.sockets.empty()) {
    if (!o.socket.empty()) return Usage("--socket and --sockets exclude each other");
    if (nodes_given && o.nodes != int(o.sockets.size())) {
      return Usage("--nodes differs from the number of --sockets");
    }
    o.nodes = int(o.sockets.size());
  } else if (o.nodes > 1 && !o.socket.empty()) {
    return Usage("--socket names one daemon; use --sockets (one per node) with --nodes");
  }
  if (o.world() > 64) return Usage("--nodes x --nranks must be at most 64");
  // One socket per node, from the daemons we start when none were named.
  std::vector<std::string> sockets = o.sockets;
  pid_t daemon = -1;
  hsdp::bench::LocalCluster cluster;
  if (o.nodes == 1 && sockets.empty()) {
    if (o.socket.empty()) {
      const std::string extra =
          o.node_config.empty() ? "" : "--node-config '" + o.node_config + "'";
      daemon = hsdp::bench::SpawnDaemon(hsdp::bench::SelfDir(), &o.socket, extra);
      if (daemon < 0) {
        std::fprintf(stderr, "hsdp-bench: could not start hsdpd from %s\n", hsdp::bench::SelfDir().c_str());
        return 1;
      }
    }
    sockets = {o.socket};
  } else if (sockets.empty()) {
    std::string extra, error;
    if (!o.node_config.empty() && !ReadExtraYaml(o.node_config, &extra, &error)) {
      return Usage(error.c_str());
    }
    if (!cluster.Start(hsdp::bench::SelfDir(), o.nodes, extra, 30000, &error)) {
      std::fprintf(stderr, "hsdp-bench: could not start a %d-node cluster: %s\n", o.nodes,
                   error.c_str());
      return 1;
    }
    sockets = cluster.sockets();
  }
  const std::string job = "hsdp-bench-" + std::to_string(::getpid());
  std::fflush(stdout);
  std::vector<pid_t> kids;
  for (int r = 0; r < o.world(); ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      const int code = RunRank(o, r, job, sockets[r / o.nranks]);
      std::fflush(stdout);  // _exit skips stdio flushing
      _exit(code);
    }
    kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t k : kids) {
    int status = 0;
    ::waitpid(k, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    rc = std::max(rc, code);
  }
  if (daemon > 0) hsdp::bench::StopDaemon(daemon);
  cluster.Stop();
  return rc;
}
