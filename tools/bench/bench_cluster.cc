#include "bench_cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../../tests/common/ports.h"  // the tests' helpers; hsdp-bench has no root include path
#include "../../tests/common/spawn.h"  // SpawnLogged
#include "hsdp/common/unix_socket.h"

namespace hsdp::bench {
namespace {

using Clock = std::chrono::steady_clock;

bool WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return ::close(fd) == 0 && ok;
}

// 32 random bytes, hex: the cluster's shared secret.
std::string RandomToken() {
  unsigned char raw[32] = {};
  std::ifstream in("/dev/urandom", std::ios::binary);
  in.read(reinterpret_cast<char*>(raw), sizeof(raw));
  std::string hex;
  char b[3];
  for (unsigned char c : raw) {
    std::snprintf(b, sizeof(b), "%02x", c);
    hex += b;
  }
  return hex;
}

}  // namespace

std::string LoopbackClusterYaml(const std::string& coordinator, const std::string& listen,
                                int nodes, int rank, const std::string& token_file) {
  // Heartbeats are relaxed (lost after 10 s): the benchmark's spinning ranks
  // may starve a daemon for a while on a small machine.
  std::ostringstream y;
  y << "cluster:\n"
    << "  coordinator: \"" << coordinator << "\"\n"
    << "  listen: \"" << listen << "\"\n"
    << "  nodes: " << nodes << "\n"
    << "  node_rank: " << rank << "\n"
    << "  token_file: \"" << token_file << "\"\n"
    << "  heartbeat_ms: 500\n"
    << "  missed_heartbeats: 20\n"
    << "  join_timeout_ms: 30000\n";
  return y.str();
}

bool LocalCluster::Start(const std::string& bin_dir, int nodes, const std::string& extra_yaml,
                         int ready_ms, std::string* error) {
  Stop();
  char tmpl[] = "/tmp/hsdp-bench-cluster.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    *error = "cannot create a temporary directory";
    return false;
  }
  dir_ = tmpl;
  const std::string token = dir_ + "/token";
  if (!WriteFile(token, RandomToken() + "\n", 0600)) {
    *error = "cannot write " + token;
    return false;
  }
  std::vector<std::string> listen(nodes);
  for (int i = 0; i < nodes; ++i) {
    const int port = ::hsdp::testing::FreePort();
    if (port == 0) {
      *error = "no free loopback port";
      return false;
    }
    listen[i] = "127.0.0.1:" + std::to_string(port);
  }
  for (int i = 0; i < nodes; ++i) {
    const std::string node_dir = dir_ + "/node" + std::to_string(i);
    ::mkdir(node_dir.c_str(), 0700);
    const std::string cfg = node_dir + "/node.yaml";
    std::string yaml = extra_yaml;
    if (!yaml.empty() && yaml.back() != '\n') yaml += '\n';
    yaml += LoopbackClusterYaml(listen[0], listen[i], nodes, i, token);
    if (!WriteFile(cfg, yaml, 0600)) {
      *error = "cannot write " + cfg;
      return false;
    }
    sockets_.push_back(node_dir + "/hsdpd.sock");
    pids_.push_back(testing::SpawnLogged({bin_dir + "/hsdpd", "--socket", sockets_.back(),
                                          "--log-level", "warning", "--node-config", cfg},
                                         node_dir + "/hsdpd.log", testing::Lifetime::kIndependent,
                                         /*env=*/{}, /*log_mode=*/0600));
  }
  // Every daemon accepts clients only once it joined, so a connectable
  // socket on every node means the cluster is formed.
  const auto deadline = Clock::now() + std::chrono::milliseconds(ready_ms);
  for (int i = 0; i < nodes; ++i) {
    for (;;) {
      if (ConnectUnix(sockets_[i]).ok()) break;
      int status;
      if (::waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
        pids_[i] = -1;
        *error = "hsdpd of node " + std::to_string(i) + " exited:\n" + LogTail(i);
        Stop();
        return false;
      }
      if (Clock::now() > deadline) {
        *error = "hsdpd of node " + std::to_string(i) + " not ready after " +
                 std::to_string(ready_ms) + " ms:\n" + LogTail(i);
        Stop();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return true;
}

std::string LocalCluster::LogTail(int node) const {
  std::ifstream in(dir_ + "/node" + std::to_string(node) + "/hsdpd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 3000 ? s.substr(s.size() - 3000) : s;
}

void LocalCluster::Stop() {
  for (pid_t p : pids_) {
    if (p > 0) ::kill(p, SIGTERM);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (pid_t& p : pids_) {
    while (p > 0) {
      int status;
      const pid_t r = ::waitpid(p, &status, WNOHANG);
      if (r == p || r < 0) {
        p = -1;
      } else if (Clock::now() > deadline) {
        ::kill(p, SIGKILL);
        ::waitpid(p, &status, 0);
        p = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  pids_.clear();
  sockets_.clear();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

}  // namespace hsdp::bench
