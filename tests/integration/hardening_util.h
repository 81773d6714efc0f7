// Helpers for the hardening tests: raw connections to the daemon's socket,
// a bare Attach + data-connection hello (so a test controls every byte and
// fd it sends), running code as another uid, and the CPU time a process has
// used (to catch busy loops).
#ifndef HSDP_TESTS_INTEGRATION_HARDENING_UTIL_H_
#define HSDP_TESTS_INTEGRATION_HARDENING_UTIL_H_

#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/unix_socket.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/layout.h"
#include "hsdp/v1/node.grpc.pb.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp::testing {

inline constexpr uid_t kNobody = 65534;
inline constexpr char kHttp2Preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";  // 24 bytes

// Seconds of CPU (user + system) `pid` has used, or -1.
inline double CpuSeconds(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields after the name start at 3 (state); utime is 14, stime 15.
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU seconds `pid` uses during the next `ms` milliseconds.
inline double CpuDuring(pid_t pid, int ms) {
  const double before = CpuSeconds(pid);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return CpuSeconds(pid) - before;
}

// Resident memory of `pid` in KiB (the kernel's own accounting).
inline int64_t RssKiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

inline int CountOpenFds(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  CommandResult r = RunCommand("ls " + dir + " | wc -l");
  return r.exit_code == 0 ? std::stoi(r.output) : -1;
}

// The fds of a daemon that just started, once it has settled: its gRPC
// server makes its pollers' eventfds on the first calls, after the socket
// already accepts, so a count taken at once can be low. Makes one call
// (hsdpctl status), then waits for three equal counts 100 ms apart (3 s at
// most).
inline int SettledFdCount(pid_t pid, const std::string& socket) {
  (void)RunCommand(Hsdpctl(socket, "status") + " >/dev/null 2>&1");
  int last = -2, same = 0;  // -2: no count yet (CountOpenFds fails with -1)
  Eventually(
      [&] {
        const int now = CountOpenFds(pid);
        same = now == last ? same + 1 : 0;
        last = now;
        return same >= 2;
      },
      3000, /*poll_ms=*/100);
  return last;
}

// Connects and writes `bytes` (may be empty). Invalid fd on failure.
inline UniqueFd ConnectAndSend(const std::string& socket, const std::string& bytes) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(socket);
  if (!fd.ok()) return UniqueFd();
  if (!bytes.empty() && ::send(fd->get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
                            static_cast<ssize_t>(bytes.size())) {
    return UniqueFd();
  }
  return std::move(*fd);
}

// True when the daemon closed `fd` (EOF or reset) within `timeout_ms`;
// whatever it sent before is skipped.
inline bool ClosedWithin(int fd, int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  char buf[4096];
  for (;;) {
    const int64_t left = deadline - NowMs();
    if (left < 0) return false;
    struct pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
  }
}

// How many of `fds` the daemon closes within `timeout_ms` (invalid ones count
// as closed). Returns as soon as `stop_at` are closed (all of them by
// default); waits the whole time only if fewer close.
inline int CountClosedWithin(const std::vector<UniqueFd>& fds, int timeout_ms,
                             int stop_at = -1) {
  if (stop_at < 0) stop_at = static_cast<int>(fds.size());
  std::vector<bool> closed(fds.size(), false);
  int count = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].valid()) closed[i] = true, ++count;
  }
  const int64_t deadline = NowMs() + timeout_ms;
  char buf[4096];
  while (count < stop_at) {
    const int64_t left = deadline - NowMs();
    if (left <= 0) break;
    std::vector<struct pollfd> p;
    std::vector<size_t> index;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (closed[i]) continue;
      p.push_back({fds[i].get(), POLLIN, 0});
      index.push_back(i);
    }
    if (::poll(p.data(), p.size(), static_cast<int>(left)) <= 0) break;
    for (size_t k = 0; k < p.size(); ++k) {
      if (p[k].revents == 0) continue;
      const ssize_t n = ::recv(p[k].fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) closed[index[k]] = true, ++count;
    }
  }
  return count;
}

// Runs `body` in a forked child as uid/gid 65534 (no groups); returns its
// exit code (or -1 on timeout). The child must not use gRPC.
inline int RunAsNobody(const std::function<int()>& body, int timeout_ms = 10000) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0) {
      _exit(99);
    }
    _exit(body());
  }
  const int rc = WaitExit(pid, timeout_ms);
  if (rc == -1) {
    ::kill(pid, SIGKILL);
    WaitExit(pid, 5000);
  }
  return rc;
}

struct RawAttach {
  uint64_t session_id = 0;
  std::string token;
};

// Attach through gRPC only (no data connection).
inline absl::StatusOr<RawAttach> AttachOnly(const std::string& socket, const std::string& job) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto stub = v1::Node::NewStub(
      grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args));
  const v1::AttachRequest req = RawAttachRequest(job, 0, 1);
  v1::AttachResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.set_wait_for_ready(true);
  grpc::Status s = stub->Attach(&ctx, req, &resp);
  if (!s.ok()) return absl::UnknownError("Attach: " + s.error_message());
  return RawAttach{resp.session_id(), resp.session_token()};
}

inline shm::DataHello MakeHello(const RawAttach& a) {
  shm::DataHello hello{};
  std::memcpy(hello.magic, shm::kDataHelloMagic, sizeof(hello.magic));
  hello.version = shm::kLayoutVersion;
  hello.session_id = a.session_id;
  std::memcpy(hello.token, a.token.data(),
              std::min<size_t>(a.token.size(), shm::kSessionTokenBytes));
  return hello;
}

// Opens the data connection of `a` and completes the hello; returns the
// connection (the fds of the reply are closed).
inline absl::StatusOr<UniqueFd> OpenDataConnection(const std::string& socket, const RawAttach& a,
                                                   int timeout_ms = 10000) {
  absl::StatusOr<UniqueFd> conn = ConnectUnix(socket);
  if (!conn.ok()) return conn.status();
  const shm::DataHello hello = MakeHello(a);
  if (absl::Status s = SendWithFds(conn->get(), &hello, sizeof(hello), {}); !s.ok()) return s;
  shm::DataHelloReply reply{};
  std::vector<UniqueFd> fds;
  if (absl::Status s = RecvWithFds(conn->get(), &reply, sizeof(reply), &fds, timeout_ms); !s.ok()) {
    return s;
  }
  if (reply.code != 0) {
    return absl::UnknownError("hello refused: " + std::string(reply.message, reply.message_len));
  }
  return std::move(*conn);
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_HARDENING_UTIL_H_
