#include "tools/bench/sim_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/common/spawn.h"

namespace hsdp::sim {

namespace {

constexpr int kMaxChildren = 16;
std::atomic<pid_t> g_children[kMaxChildren];

void Register(pid_t pid) {
  for (auto& c : g_children) {
    pid_t zero = 0;
    if (c.compare_exchange_strong(zero, pid)) return;
  }
}

std::string Label(absl::string_view line, absl::string_view name) {
  const std::string key = absl::StrCat(name, "=\"");
  const size_t at = line.find(key);
  if (at == absl::string_view::npos) return "";
  const size_t start = at + key.size();
  const size_t end = line.find('"', start);
  return std::string(line.substr(start, end - start));
}

}  // namespace

void KillChild(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  int status;
  ::waitpid(pid, &status, 0);
  for (auto& c : g_children) {
    pid_t p = pid;
    c.compare_exchange_strong(p, 0);
  }
}

void KillAllChildren() {
  for (auto& c : g_children) {
    const pid_t pid = c.exchange(0);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int status;
      ::waitpid(pid, &status, 0);
    }
  }
}

void OnSignal(int sig) {
  for (auto& c : g_children) {
    const pid_t pid = c.load();
    if (pid > 0) ::kill(pid, SIGKILL);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

bool Exited(pid_t pid) {
  int status;
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = ::hsdp::testing::SpawnLogged(argv, log);
  if (pid > 0) Register(pid);
  return pid;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/hsdp-msim.XXXXXX";
  path_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "";
}

TempDir::TempDir(const std::string& under) {
  std::string tmpl = under + "/hsdp-msim.XXXXXX";
  path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

double CpuSeconds(const std::string& pid) {
  const std::string stat = ReadFile("/proc/" + pid + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  // After "pid (comm) ": state is field 3, utime 14, stime 15.
  if (f.size() < 13) return 0;
  double ut = 0, st = 0;
  (void)absl::SimpleAtod(f[11], &ut);
  (void)absl::SimpleAtod(f[12], &st);
  return (ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

int CountFds() {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); ++it) {
    ++n;
  }
  return n;
}

int CountThreads() {
  const std::string status = ReadFile("/proc/self/status");
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (absl::ConsumePrefix(&line, "Threads:")) {
      int n = 0;
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &n);
      return n;
    }
  }
  return 0;
}

std::string HttpGet(int port, const std::string& path, absl::Duration timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{};
  tv.tv_sec = absl::ToInt64Seconds(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

EtcdCounters Scrape(int port) {
  EtcdCounters c;
  const std::string body = HttpGet(port, "/metrics", absl::Seconds(5));
  if (body.empty()) return c;
  c.ok = true;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const bool handled = absl::StartsWith(line, "grpc_server_handled_total{");
    const bool received = absl::StartsWith(line, "grpc_server_msg_received_total{");
    const bool sent = absl::StartsWith(line, "grpc_server_msg_sent_total{");
    if (!handled && !received && !sent) continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &v)) continue;
    const bool unary = Label(line, "grpc_type") == "unary";
    if (handled && unary) c.unary_handled += v;
    if (received && !unary) c.stream_received += v;
    if (sent && !unary) {
      c.stream_sent += v;
      if (Label(line, "grpc_method") == "Watch") c.watch_sent += v;
    }
  }
  return c;
}

}  // namespace hsdp::sim
