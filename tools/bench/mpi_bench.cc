// mpi-bench: the Open MPI baseline for hsdp-bench (latency of one collective).
//
//   mpirun --allow-run-as-root --oversubscribe -np N build/bin/mpi-bench
//          [--op all_reduce|all_gather|reduce_scatter|barrier]
//          [--min-bytes 4K] [--max-bytes 64M] [--step-factor 2]
//          [--iters 20] [--warmup 5] [--json]
//
// float32, sum, out-of-place. "size" is the total buffer as in nccl-tests and
// hsdp-bench: the gathered output for all-gather, the full input for
// reduce-scatter (MPI_Reduce_scatter_block); busbw uses the nccl-tests factors.
// Every iteration starts with MPI_Barrier, then each rank times one
// collective with steady_clock; rank 0 reports its own times: mean (time),
// median (p50) and p99. Each size is checked once (a few output elements
// against the expected sum); #wrong is the total over all ranks.
// tools/bench/latency_compare.py runs it beside hsdp-bench and gloo-bench.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "baseline_bench.h"

namespace {

using hsdp::baseline::CountWrongAt;
using hsdp::baseline::Input;
using hsdp::baseline::NextSize;
using hsdp::baseline::Op;
using hsdp::baseline::Options;
using hsdp::baseline::ParseArgs;
using hsdp::baseline::PlanSize;
using hsdp::baseline::PrintHeader;
using hsdp::baseline::PrintRow;
using hsdp::baseline::SizePlan;
using hsdp::baseline::TimeRuns;

// Runs every size; returns the exit code (3 when some output was wrong).
int Run(const Options& o, int rank, int n) {
  const uint64_t max_total = std::max<uint64_t>(o.max_bytes, sizeof(float) * n) / sizeof(float);
  std::vector<float> send(max_total), recv(max_total);
  if (rank == 0) PrintHeader("mpi-bench", "out-of-place", o, n);
  bool first = true;
  uint64_t any_wrong = 0;
  for (uint64_t size = o.min_bytes; size <= o.max_bytes; size = NextSize(o, size)) {
    SizePlan plan;
    if (!PlanSize(o, n, size, &plan)) continue;
    const uint64_t total = plan.total, count = plan.count, in_elems = plan.in_elems;
    const uint64_t bytes = plan.bytes();
    for (uint64_t i = 0; i < in_elems; ++i) send[i] = Input(rank, i);
    const int c = int(count);
    auto run_once = [&] {
      switch (o.op) {
        case Op::kAllReduce:
          return MPI_Allreduce(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        case Op::kAllGather:
          return MPI_Allgather(send.data(), c, MPI_FLOAT, recv.data(), c, MPI_FLOAT,
                               MPI_COMM_WORLD);
        case Op::kReduceScatter:
          return MPI_Reduce_scatter_block(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM,
                                          MPI_COMM_WORLD);
        default:
          return MPI_Barrier(MPI_COMM_WORLD);
      }
    };
    // One checked run per size (MPI's default handler aborts on errors).
    run_once();
    const uint64_t wrong = CountWrongAt(o, n, rank, recv.data(), plan);
    uint64_t wrong_all = 0;
    MPI_Allreduce(&wrong, &wrong_all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (wrong > 0) {
      std::fprintf(stderr, "mpi-bench: rank %d: %llu wrong elements at size %llu\n", rank,
                   (unsigned long long)wrong, (unsigned long long)bytes);
    }
    any_wrong += wrong_all;
    const std::vector<double> times = TimeRuns(
        o, [] { MPI_Barrier(MPI_COMM_WORLD); }, run_once);
    if (rank == 0) PrintRow(o, n, first, bytes, total, times, wrong_all);
    first = false;
    if (o.op == Op::kBarrier) break;  // one row, as hsdp-bench
  }
  if (rank == 0 && o.json) std::printf("\n]\n");
  return any_wrong > 0 ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  Options o;
  const std::string error = ParseArgs(argc, argv, /*with_nranks=*/false, &o);
  int rc = 0;
  if (!error.empty()) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "mpi-bench: %s\n(see the comment at the top of "
                   "tools/bench/mpi_bench.cc)\n",
                   error.c_str());
    }
    rc = 2;
  } else {
    try {
      rc = Run(o, rank, n);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "mpi-bench: rank %d: out of memory for --max-bytes %llu\n", rank,
                   (unsigned long long)o.max_bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return rc;
}
