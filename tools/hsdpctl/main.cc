// hsdpctl: operator CLI over hsdpd's Admin and Health services.
//
//   hsdpctl [--socket PATH] [--json] [--timeout SECONDS] COMMAND [OPTIONS]
//   COMMAND: status | sessions | jobs | config | health | trace | stragglers | top
//
// Exit codes: 0 success, 1 the daemon is down or refused, 2 bad usage.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "commands.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/socket_path.h"
#include "hsdp/v1/admin.grpc.pb.h"

namespace hsdpctl {

void SetDeadline(grpc::ClientContext* ctx, const Context& c, double seconds) {
  ctx->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(seconds > 0 ? seconds : c.timeout_s)));
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

int Fail(const Context& c, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "hsdpctl: hsdpd is not answering on " << c.socket << " (" << s.error_message()
              << "); is it running?\n";
  } else {
    std::cerr << "hsdpctl: hsdpd refused: " << s.error_message() << "\n";
  }
  return 1;
}

}  // namespace hsdpctl

namespace {

using hsdpctl::ToJson;

constexpr char kUsage[] =
    "usage: hsdpctl [--socket PATH] [--json] [--timeout SECONDS] COMMAND\n"
    "commands:\n"
    "  status     version, uptime, engine, totals, jobs and sessions\n"
    "  sessions   one line per attached trainer\n"
    "  jobs       one line per job\n"
    "  config     the daemon's effective configuration (YAML)\n"
    "  health     SERVING / NOT_SERVING (exit 1 unless serving)\n"
    "  nodes      cluster nodes, their state and the epoch (exit 1 when degraded)\n"
    "  trace [--seconds N] [-o FILE] [--job J]\n"
    "             record every operation for N s (default 5) into a Chrome trace /\n"
    "             Perfetto JSON file (default trace.json; - = stdout)\n"
    "  stragglers [--job J]\n"
    "             ranks the others waited for (arrived last), most total wait first\n"
    "  drain [--timeout S]\n"
    "             stop taking new work, let the operations in flight finish (at most\n"
    "             S s, default 60), then hsdpd exits 0 for a restart or upgrade;\n"
    "             waits for that exit (root or hsdpd's uid only)\n"
    "  top [--interval S] [--iterations N]\n"
    "             live per-job view: op rate, bandwidth, failures, slowest rank;\n"
    "             one snapshot when stdout is not a terminal\n"
    "The socket defaults to $HSDPD_SOCKET, else the daemon's default path.\n";

// The pid of the process listening on `socket` (SO_PEERCRED), 0 if unknown.
pid_t DaemonPid(const std::string& socket) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  pid_t pid = 0;
  if (socket.size() < sizeof(addr.sun_path)) {
    std::memcpy(addr.sun_path, socket.data(), socket.size());
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      pid = cred.pid;
    }
  }
  ::close(fd);
  return pid;
}

// Whether `pid` still runs: it exists and is not a zombie (an exited daemon
// whose parent has not reaped it yet has stopped serving).
bool Running(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  FILE* f = std::fopen(absl::StrFormat("/proc/%d/stat", static_cast<int>(pid)).c_str(), "r");
  if (f == nullptr) return true;  // no /proc: kill() said it exists
  char buf[512] = {0};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  // "pid (comm) S ...": the state follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  return !(n > 0 && close != nullptr && close[1] == ' ' && close[2] == 'Z');
}

// hsdpctl drain: the Drain RPC, then waits until that daemon process is gone.
int Drain(hsdpctl::Context& c) {
  const pid_t pid = DaemonPid(c.socket);
  const double timeout = c.timeout_given ? c.timeout_s : 0;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  hsdp::v1::DrainRequest req;
  req.set_timeout_seconds(timeout);
  hsdp::v1::DrainResponse resp;
  grpc::Status s = c.admin->Drain(&ctx, req, &resp);
  if (!s.ok()) return hsdpctl::Fail(c, s);
  std::printf("hsdpd%s draining: %llu sessions, %llu operations in flight; it exits once they "
              "are done or after %.0f s\n",
              resp.already_draining() ? " was already" : " is",
              static_cast<unsigned long long>(resp.sessions()),
              static_cast<unsigned long long>(resp.ops_in_flight()), resp.timeout_seconds());
  std::fflush(stdout);
  // The drain's timeout, then the shutdown's own grace.
  const absl::Time until = absl::Now() + absl::Seconds(resp.timeout_seconds() + 30);
  while (absl::Now() < until) {
    const bool gone = pid > 0 ? !Running(pid) : ::access(c.socket.c_str(), F_OK) != 0;
    if (gone) {
      std::printf("hsdpd stopped\n");
      return 0;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::fprintf(stderr, "hsdpctl: hsdpd (pid %d) still runs %.0f s after the drain began\n",
               static_cast<int>(pid), resp.timeout_seconds() + 30);
  return 1;
}

void PrintSessions(const hsdp::v1::StatusResponse& r) {
  // OWNER: the job's owner (a job is its owner plus its id); UID: the session's.
  std::printf("%-8s %-20s %10s %10s %6s %6s %-8s %8s %8s %12s %10s %8s\n", "SESSION", "JOB",
              "OWNER", "UID", "RANK", "WORLD", "DEVICE", "PID", "BUFFERS", "BYTES", "OPS",
              "FAILED");
  for (const auto& s : r.sessions()) {
    std::printf("%-8llu %-20s %10u %10u %6d %6d %-8s %8lld %8u %12llu %10llu %8llu\n",
                static_cast<unsigned long long>(s.session_id()), s.job_id().c_str(),
                s.owner_uid(), s.peer_uid(), s.rank(),
                s.world_size(), s.device().c_str(), static_cast<long long>(s.pid()), s.buffers(),
                static_cast<unsigned long long>(s.buffer_bytes()),
                static_cast<unsigned long long>(s.ops_completed()),
                static_cast<unsigned long long>(s.ops_failed()));
  }
}

void PrintJobs(const hsdp::v1::StatusResponse& r) {
  // A job is its owner plus its id: root sees two users' same-named jobs as two lines.
  std::printf("%-24s %10s %6s %9s %7s %s\n", "JOB", "OWNER", "WORLD", "ATTACHED", "GROUPS",
              "CLASS");
  for (const auto& j : r.jobs()) {
    std::printf("%-24s %10u %6d %9d %7u %s(%u)\n", j.job_id().c_str(), j.owner_uid(),
                j.world_size(), j.attached_ranks(), j.groups(), j.priority_class().c_str(),
                j.priority_level());
  }
}

// `hsdpctl nodes`: 0 when the cluster is fine (or single node), 1 when this
// daemon sees it degraded or failed.
int Nodes(const hsdpctl::Context& c, std::chrono::system_clock::time_point deadline) {
  auto stub = hsdp::v1::AdminCluster::NewStub(c.channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  hsdp::v1::NodesResponse r;
  grpc::Status s = stub->Nodes(&ctx, hsdp::v1::NodesRequest(), &r);
  if (!s.ok()) return hsdpctl::Fail(c, s);
  const bool bad = r.state() == "degraded" || r.state() == "failed";
  if (c.json) {
    std::cout << ToJson(r);
    return bad ? 1 : 0;
  }
  if (!r.enabled()) {
    std::printf("single node (no cluster.coordinator configured)\n");
    return 0;
  }
  // cluster.store: etcd names etcd where the embedded store names its coordinator.
  const bool etcd = r.coordinator().rfind("etcd (", 0) == 0;
  std::printf("cluster %s, epoch %llu, this node %d of %u, %s %s%s\n", r.state().c_str(),
              static_cast<unsigned long long>(r.epoch()), r.node_rank(), r.expected_nodes(),
              etcd ? "store" : "coordinator", r.coordinator().c_str(),
              r.is_coordinator() ? " (this node)" : "");
  if (!r.detail().empty()) std::printf("%s\n", r.detail().c_str());
  std::printf("%-5s %-24s %-16s %-20s %-6s %10s\n", "NODE", "ADDRESS", "DATA", "NAME", "STATE",
              "HEARTBEAT");
  for (const auto& n : r.nodes()) {
    std::printf("%-5d %-24s %-16s %-20s %-6s %9.1fs%s\n", n.node_rank(), n.address().c_str(),
                n.data_address().c_str(), n.name().c_str(), n.state().c_str(),
                n.last_heartbeat_age_s(), n.self() ? "  *" : "");
  }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  hsdpctl::Context c;
  std::string command;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    const size_t eq = a.find('=');
    const bool has_value = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (has_value) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    // The flag's value: after '=' or the next argument.
    auto take = [&](std::string* out) {
      if (has_value) {
        *out = value;
        return true;
      }
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    auto take_number = [&](double* out) {
      std::string v;
      if (!take(&v)) return false;
      char* end = nullptr;
      *out = std::strtod(v.c_str(), &end);
      return !v.empty() && end != nullptr && *end == '\0';
    };
    double number = 0;
    bool ok = true;
    if (a == "--socket") {
      ok = take(&c.socket);
    } else if (a == "--json") {
      c.json = true;
    } else if (a == "--timeout") {
      ok = take_number(&c.timeout_s);
      c.timeout_given = true;
    } else if (a == "--seconds") {
      ok = take_number(&c.seconds);
    } else if (a == "-o" || a == "--output") {
      ok = take(&c.output);
    } else if (a == "--job") {
      ok = take(&c.job);
    } else if (a == "--interval") {
      ok = take_number(&c.interval_s);
    } else if (a == "--iterations") {
      ok = take_number(&number) && number >= 0;
      c.iterations = static_cast<int>(number);
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (command.empty() && !a.empty() && a[0] != '-') {
      command = a;
    } else {
      std::cerr << "hsdpctl: unexpected argument \"" << argv[i] << "\"\n" << kUsage;
      return 2;
    }
    if (!ok) {
      std::cerr << "hsdpctl: " << a << " needs a valid value\n" << kUsage;
      return 2;
    }
  }
  if (command.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  if (command != "status" && command != "sessions" && command != "jobs" && command != "config" &&
      command != "health" && command != "trace" && command != "stragglers" && command != "top" &&
      command != "nodes" && command != "drain") {
    std::cerr << "hsdpctl: unknown command \"" << command << "\"\n" << kUsage;
    return 2;
  }
  if (c.socket.empty()) c.socket = hsdp::ClientDefaultSocketPath();
  const std::string& socket = c.socket;
  const bool json = c.json;

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetMaxReceiveMessageSize(512 << 20);  // traces of a busy node are large
  auto channel = grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args);
  const auto deadline = absl::ToChronoTime(absl::Now() + absl::Seconds(c.timeout_s));
  c.channel = channel;
  c.admin = hsdp::v1::Admin::NewStub(channel);
  if (command == "trace") return hsdpctl::RunTrace(c);
  if (command == "stragglers") return hsdpctl::RunStragglers(c);
  if (command == "top") return hsdpctl::RunTop(c);
  if (command == "nodes") return Nodes(c, deadline);
  if (command == "drain") return Drain(c);

  if (command == "health") {
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, req, &resp);
    if (!s.ok()) return hsdpctl::Fail(c, s);
    if (json) {
      std::cout << ToJson(resp);
    } else {
      std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
    }
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }

  auto& stub = c.admin;
  if (command == "config") {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    hsdp::v1::GetConfigResponse resp;
    grpc::Status s = stub->GetConfig(&ctx, hsdp::v1::GetConfigRequest(), &resp);
    if (!s.ok()) return hsdpctl::Fail(c, s);
    std::cout << (json ? ToJson(resp) : resp.yaml());
    return 0;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  hsdp::v1::StatusResponse r;
  grpc::Status s = stub->Status(&ctx, hsdp::v1::StatusRequest(), &r);
  if (!s.ok()) return hsdpctl::Fail(c, s);
  if (json) {
    if (command == "sessions") {
      hsdp::v1::StatusResponse only;
      *only.mutable_sessions() = r.sessions();
      std::cout << ToJson(only);
    } else if (command == "jobs") {
      hsdp::v1::StatusResponse only;
      *only.mutable_jobs() = r.jobs();
      std::cout << ToJson(only);
    } else {
      std::cout << ToJson(r);
    }
    return 0;
  }
  if (command == "sessions") {
    PrintSessions(r);
  } else if (command == "jobs") {
    PrintJobs(r);
  } else {
    std::printf("hsdpd %s on %s, socket %s\n", r.version().c_str(), r.node_name().c_str(),
                r.socket_path().c_str());
    std::printf("uptime %.1f s, engine %s with %d threads\n", r.uptime_seconds(), r.engine().c_str(),
                r.engine_threads());
    std::printf("config: %s\n", r.config_summary().c_str());
    if (!r.metrics_address().empty()) {
      std::printf("metrics: http://%s/metrics\n", r.metrics_address().c_str());
    }
    std::printf("sessions %d, jobs %d, ops completed %llu, failed %llu, registered %llu bytes\n",
                r.sessions_size(), r.jobs_size(), static_cast<unsigned long long>(r.ops_completed()),
                static_cast<unsigned long long>(r.ops_failed()),
                static_cast<unsigned long long>(r.bytes_registered()));
    // Ended cross-node groups still held so that peers learn why (about 2 heartbeats).
    std::printf("retired groups %llu\n", static_cast<unsigned long long>(r.retired_groups()));
    if (r.jobs_size() > 0) PrintJobs(r);
    if (r.sessions_size() > 0) PrintSessions(r);
  }
  return 0;
}
