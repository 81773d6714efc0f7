// Helpers shared by hsdp-bench and the multi-process tests: test patterns,
// 16-bit float conversion, spawning a private daemon.
#ifndef HSDP_TOOLS_BENCH_BENCH_UTIL_H_
#define HSDP_TOOLS_BENCH_BENCH_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "hsdp/types.h"

namespace hsdp::bench {

// Value rank `rank` puts at element `i` for checks: a small integer
// (exact in every dtype, also after summing up to 16 ranks).
inline double PatternValue(int rank, uint64_t i) { return double(rank + 1) + double(i % 7); }

// Writes/reads element `i` of a `dtype` array as a double.
void StoreAs(DataType dtype, void* base, uint64_t i, double v);
double LoadAs(DataType dtype, const void* base, uint64_t i);

// Starts `hsdpd --socket <dir>/hsdpd.sock` from `bin_dir` and waits until it
// answers; returns its pid (or -1) and sets *socket.
pid_t SpawnDaemon(const std::string& bin_dir, std::string* socket, const std::string& extra_args);
// SIGTERM and reap; returns the exit status (or -1).
int StopDaemon(pid_t pid);

// Directory of the running executable.
std::string SelfDir();

}  // namespace hsdp::bench

#endif  // HSDP_TOOLS_BENCH_BENCH_UTIL_H_
