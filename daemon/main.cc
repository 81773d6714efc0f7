// hsdpd: the per-node communication daemon.
//
//   hsdpd [--node-config FILE] [--socket PATH] [--log-level LEVEL]
//   hsdpd --print-default-config
//   hsdpd --check-config FILE
//
// Exit codes: 0 clean shutdown or valid config, 1 runtime failure (e.g.
// another instance owns the socket), 2 bad flags or bad configuration.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/str_join.h"
#include "daemon/config/node_config.h"
#include "daemon/server/cluster_engine.h"
#include "daemon/server/daemon.h"
#include "daemon/util/sd_notify.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/socket_path.h"
#include "hsdp/common/version.h"

namespace {

constexpr char kUsage[] =
    "usage: hsdpd [--node-config FILE] [--socket PATH] [--log-level debug|info|warning|error]\n"
    "       hsdpd --print-default-config\n"
    "       hsdpd --check-config FILE\n"
    "       hsdpd --version\n";

struct Flags {
  std::string node_config;
  std::string socket;
  std::string log_level;
  std::string check_config;
  bool print_default = false;
};

// Returns false (after printing why) on a bad command line.
bool ParseFlags(int argc, char** argv, Flags* f, int* exit_code) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto take = [&](std::string* out) {
      if (!value.empty()) {
        *out = value;
        return true;
      }
      if (i + 1 >= argc) {
        std::cerr << "hsdpd: " << a << " needs a value\n" << kUsage;
        return false;
      }
      *out = argv[++i];
      return true;
    };
    if (a == "--node-config") {
      if (!take(&f->node_config)) return false;
    } else if (a == "--socket") {
      if (!take(&f->socket)) return false;
    } else if (a == "--log-level") {
      if (!take(&f->log_level)) return false;
    } else if (a == "--check-config") {
      if (!take(&f->check_config)) return false;
    } else if (a == "--print-default-config") {
      f->print_default = true;
    } else if (a == "--version") {
      std::cout << "hsdpd " << hsdp::kHsdpVersion << "\n";
      *exit_code = 0;
      return false;
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      *exit_code = 0;
      return false;
    } else {
      std::cerr << "hsdpd: unknown argument \"" << a << "\"\n" << kUsage;
      return false;
    }
  }
  return true;
}

// SIGHUP: reads --node-config again and applies what a running daemon can
// (Daemon::Reload); an invalid file changes nothing. Flags given on the
// command line keep winning over the file, as at start.
void Reload(const Flags& flags, const hsdp::NodeConfig& started, hsdp::Daemon* daemon) {
  if (flags.node_config.empty()) {
    HSDP_LOG(Info) << "SIGHUP: no --node-config file; nothing to reload";
    return;
  }
  absl::StatusOr<hsdp::NodeConfig> next = hsdp::LoadNodeConfigFile(flags.node_config);
  if (!next.ok()) {
    HSDP_LOG(Warning) << "SIGHUP: " << flags.node_config
                      << " is invalid, nothing changed: " << next.status().message();
    return;
  }
  next->socket_path = started.socket_path;  // resolved at start (--socket or the default)
  if (!flags.log_level.empty() && next->log_level != flags.log_level) {
    HSDP_LOG(Info) << "SIGHUP: log.level \"" << next->log_level << "\" ignored: --log-level "
                   << flags.log_level << " was given on the command line";
    next->log_level = flags.log_level;
  }
  const hsdp::Daemon::ReloadReport r = daemon->Reload(*next);
  HSDP_LOG(Info) << "SIGHUP: reloaded " << flags.node_config << ": applied ["
                 << absl::StrJoin(r.applied, ", ") << "]; needs a restart ["
                 << absl::StrJoin(r.need_restart, ", ") << "]";
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  int exit_code = 2;
  if (!ParseFlags(argc, argv, &flags, &exit_code)) return exit_code;

  if (flags.print_default) {
    std::cout << hsdp::DefaultNodeConfigYaml();
    return 0;
  }
  if (!flags.check_config.empty()) {
    absl::StatusOr<hsdp::NodeConfig> c = hsdp::LoadNodeConfigFile(flags.check_config);
    if (!c.ok()) {
      std::cerr << "hsdpd: invalid configuration: " << c.status().message() << "\n";
      return 2;
    }
    std::cout << "configuration OK: " << hsdp::NodeConfigSummary(*c) << "\n";
    return 0;
  }

  absl::StatusOr<hsdp::NodeConfig> config =
      flags.node_config.empty() ? hsdp::ParseNodeConfig(hsdp::DefaultNodeConfigYaml(), "<default>")
                                : hsdp::LoadNodeConfigFile(flags.node_config);
  if (!config.ok()) {
    std::cerr << "hsdpd: invalid configuration: " << config.status().message() << "\n";
    return 2;
  }
  if (!flags.log_level.empty()) config->log_level = flags.log_level;
  hsdp::LogLevel level;
  if (!hsdp::ParseLogLevel(config->log_level, &level)) {
    std::cerr << "hsdpd: --log-level: \"" << config->log_level
              << "\" is not one of debug, info, warning, error\n";
    return 2;
  }
  hsdp::SetLogLevel(level);
  if (!flags.socket.empty()) config->socket_path = flags.socket;
  if (config->socket_path.empty()) config->socket_path = hsdp::DaemonDefaultSocketPath();

  // Signals are taken synchronously by sigwait below.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  sigaddset(&sigs, SIGUSR1);  // hsdpctl drain: the Admin RPC wakes this thread with it
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Every client connection costs an fd: use all the kernel lets us have
  // (limits.max_connections_per_uid bounds what one user can take).
  if (struct rlimit nofile;
      getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      HSDP_LOG(Warning) << "cannot raise the open-file limit: " << std::strerror(errno);
    }
  }

  bool reload_pending = false;
  hsdp::Daemon daemon(*config, hsdp::MakeClusterEngine);
  daemon.set_drain_notifier([] { ::kill(::getpid(), SIGUSR1); });
  // Start runs on its own thread (it may wait for the cluster's coordinator
  // for up to cluster.join_timeout_ms) while this one keeps taking signals,
  // so SIGTERM / SIGINT stop a daemon that is still joining at once.
  {
    std::atomic<bool> started{false};
    absl::Status start_status;
    std::thread starter([&] {
      start_status = daemon.Start();
      started.store(true);
    });
    bool stop_requested = false;
    const struct timespec poll{0, 50 * 1000 * 1000};
    while (!started.load()) {
      siginfo_t info;
      const int sig = sigtimedwait(&sigs, &info, &poll);
      // A SIGHUP while starting is not lost: the file is read again once
      // serving (the socket may accept before this loop sees the start end).
      if (sig == SIGHUP) reload_pending = true;
      if ((sig == SIGTERM || sig == SIGINT) && !stop_requested) {
        HSDP_LOG(Info) << "received " << strsignal(sig) << " while starting; stopping";
        stop_requested = true;
        daemon.Cancel();
      }
    }
    starter.join();
    if (stop_requested) {
      daemon.Shutdown();
      return 0;
    }
    if (!start_status.ok()) {
      HSDP_LOG(Error) << "hsdpd cannot start: " << start_status.message();
      return 1;
    }
  }
  hsdp::SdNotify("READY=1\nSTATUS=serving on " + config->socket_path);
  if (reload_pending) Reload(flags, *config, &daemon);

  const int64_t watchdog_usec = hsdp::SdWatchdogUsec();
  struct timespec tick{1, 0};
  if (watchdog_usec > 0) {
    const int64_t half = watchdog_usec / 2;
    tick = {static_cast<time_t>(half / 1000000), static_cast<long>(half % 1000000) * 1000};
  }
  for (;;) {
    siginfo_t info;
    const int sig = sigtimedwait(&sigs, &info, &tick);
    if (sig == SIGTERM || sig == SIGINT) {
      HSDP_LOG(Info) << "received " << strsignal(sig) << "; shutting down";
      break;
    }
    if (daemon.drain_requested()) {  // SIGUSR1 from the Drain RPC, or a missed one
      hsdp::SdNotify("STOPPING=1\nSTATUS=draining");
      daemon.Drain();
      break;
    }
    if (sig == SIGHUP) Reload(flags, *config, &daemon);
    if (watchdog_usec > 0) hsdp::SdNotify("WATCHDOG=1");
  }
  hsdp::SdNotify("STOPPING=1");
  daemon.Shutdown();
  return 0;
}
