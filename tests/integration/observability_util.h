// Helpers for the observability integration tests: a workload of forked
// client ranks, an HTTP GET over TCP, the Prometheus text format parsed into
// series, a free TCP port, and a subprocess that is stopped on scope exit.
#ifndef HSDP_TESTS_INTEGRATION_OBSERVABILITY_UTIL_H_
#define HSDP_TESTS_INTEGRATION_OBSERVABILITY_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "hsdp/client.h"
#include "common/ports.h"  // FreePort
#include "test_util.h"

namespace hsdp::testing {

// These tests watch what the daemon sees of each operation; small operations
// of all-local groups would run in the group's arena, which the daemon never
// sees (docs/architecture.md), so their daemons send every operation through
// the daemon.
inline constexpr char kDaemonPathOnly[] = "data_plane:\n  small_op_bytes: 0\n";

struct Workload {
  std::string socket;
  std::string job;
  int world = 2;  // ranks first_rank .. first_rank + world - 1, in one group
  int first_rank = 0;
  int world_size = 0;  // the job's world size; 0 = `world`
  int all_reduces = 10;
  size_t count = 1024;  // float32 elements per all-reduce
  int all_gathers = 0;  // each with `gather_count` elements per rank
  size_t gather_count = 256;
  int slow_rank = -1;  // sleeps `delay_ms` before each submission
  int delay_ms = 0;
  std::string hold_file;  // when set: after "done", wait (<= 15 s) for this file to exist
  std::string priority_class;  // ClientOptions::priority_class
  bool latency_critical = false;  // SubmitOptions::latency_critical on every op
};

// One rank of `w` (run inside a Child): prints "done" once its operations
// completed, "FAIL ..." otherwise; returns the exit code.
inline int RunRank(const Workload& w, int rank, FILE* out) {
  ClientOptions o;
  o.socket_path = w.socket;
  o.job_id = w.job;
  o.rank = w.first_rank + rank;
  o.world_size = w.world_size > 0 ? w.world_size : w.world;
  o.priority_class = w.priority_class;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(out, "FAIL connect: %s\n", c.status().ToString().c_str());
    return 1;
  }
  std::vector<int> ranks;
  for (int r = 0; r < w.world; ++r) ranks.push_back(w.first_rank + r);
  auto g = (*c)->NewGroup(ranks);
  auto buf = (*c)->AllocateBuffer(std::max(w.count * 4, w.gather_count * 4 * (w.world + 1)));
  if (!g.ok() || !buf.ok()) {
    std::fprintf(out, "FAIL setup\n");
    return 1;
  }
  auto delay = [&] {
    if (rank == w.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(w.delay_ms));
  };
  for (int i = 0; i < w.all_reduces; ++i) {
    delay();
    SubmitOptions so;
    so.latency_critical = w.latency_critical;
    auto work =
        (*c)->AllReduce(*g, {buf->id, 0}, {buf->id, 0}, w.count, DataType::kFloat32, {}, so);
    absl::Status s = work.ok() ? work->Wait(absl::Seconds(20)) : work.status();
    if (!s.ok()) {
      std::fprintf(out, "FAIL all_reduce %d: %s\n", i, s.ToString().c_str());
      return 1;
    }
  }
  for (int i = 0; i < w.all_gathers; ++i) {
    delay();
    auto work = (*c)->AllGather(*g, {buf->id, 0}, {buf->id, w.gather_count * 4}, w.gather_count,
                                DataType::kFloat32);
    absl::Status s = work.ok() ? work->Wait(absl::Seconds(20)) : work.status();
    if (!s.ok()) {
      std::fprintf(out, "FAIL all_gather %d: %s\n", i, s.ToString().c_str());
      return 1;
    }
  }
  std::fprintf(out, "done\n");
  if (!w.hold_file.empty()) {
    (void)Eventually([&] { return Exists(w.hold_file); }, 15000, 10);
  }
  return 0;
}

// Forks the workload's ranks; waits until every rank printed "done" (true)
// or one failed or `timeout_ms` passed (false, with the outputs in *why).
inline bool RunWorkload(const Workload& w, std::vector<std::unique_ptr<Child>>* children,
                        std::string* why, int timeout_ms = 20000) {
  for (int r = 0; r < w.world; ++r) {
    children->push_back(std::make_unique<Child>([w, r](FILE* out) { return RunRank(w, r, out); }));
  }
  bool ok = true;
  for (auto& c : *children) ok = c->WaitFor("done\n", timeout_ms) && ok;
  if (!ok) {
    for (auto& c : *children) *why += c->output();
  }
  return ok;
}

// "HOST:PORT" -> port (0 when malformed).
inline int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1);
}

// GET http://127.0.0.1:port/path, with `headers` ("Name: value\r\n" each);
// the body, or "" on any failure (5 s max).
inline std::string HttpGet(int port, const std::string& path, int* status = nullptr,
                           const std::string& headers = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  struct timeval tv {
    5, 0
  };
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string resp;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers +
        "\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) resp.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (status != nullptr) {
    *status = resp.size() > 12 ? std::atoi(resp.c_str() + 9) : 0;  // "HTTP/1.1 200"
  }
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// The header of HTTP basic auth.
inline std::string BasicAuth(const std::string& user, const std::string& password) {
  return "Authorization: Basic " + absl::Base64Escape(user + ":" + password) + "\r\n";
}

// Prometheus text format: "name{labels} value" -> value, keyed by
// "name{labels}" exactly as written. Returns false (and the bad line in
// *bad) when a sample line does not parse.
inline bool ParsePromText(const std::string& text, std::map<std::string, double>* out,
                          std::string* bad) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('}');
    const size_t space = line.find(' ', brace == std::string::npos ? 0 : brace);
    if (space == std::string::npos) {
      *bad = line;
      return false;
    }
    const std::string value = line.substr(space + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() && value != "Nan") {
      *bad = line;
      return false;
    }
    (*out)[line.substr(0, space)] = v;
  }
  return true;
}

// A subprocess (stdout+stderr to `log`) terminated and reaped on scope exit.
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::string& log)
      : pid_(SpawnLogged(argv, log, Lifetime::kIndependent)), log_(log) {}
  ~Subprocess() {
    if (pid_ > 0 && WaitExit(pid_, 0) == -1) {
      ::kill(pid_, SIGTERM);
      if (WaitExit(pid_, 5000) == -1) {
        ::kill(pid_, SIGKILL);
        WaitExit(pid_, 5000);
      }
    }
  }
  pid_t pid() const { return pid_; }
  // Exit code, 128 + signal, or -1 on timeout.
  int Wait(int timeout_ms) {
    const int rc = WaitExit(pid_, timeout_ms);
    if (rc != -1) pid_ = -1;
    return rc;
  }
  std::string Log() const { return ReadFile(log_); }

 private:
  pid_t pid_;
  std::string log_;
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_OBSERVABILITY_UTIL_H_
