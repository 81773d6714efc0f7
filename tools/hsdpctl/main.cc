// hsdpctl: operator CLI over hsdpd's Admin and Health services.
//
//   hsdpctl [--socket PATH] [--json] [--timeout SECONDS]
//           status|sessions|jobs|config|health|nodes
//
// Exit codes: 0 success, 1 the daemon is down or refused, 2 bad usage.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/socket_path.h"
#include "hsdp/v1/admin.grpc.pb.h"

namespace {

constexpr char kUsage[] =
    "usage: hsdpctl [--socket PATH] [--json] [--timeout SECONDS] COMMAND\n"
    "commands:\n"
    "  status     version, uptime, engine, totals, jobs and sessions\n"
    "  sessions   one line per attached trainer\n"
    "  jobs       one line per job\n"
    "  config     the daemon's effective configuration (YAML)\n"
    "  health     SERVING / NOT_SERVING (exit 1 unless serving)\n"
    "  nodes      cluster nodes, their state and the epoch (exit 1 when degraded)\n"
    "The socket defaults to $HSDPD_SOCKET, else the daemon's default path.\n";

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

int Fail(const std::string& socket, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "hsdpctl: hsdpd is not answering on " << socket << " (" << s.error_message()
              << "); is it running?\n";
  } else {
    std::cerr << "hsdpctl: hsdpd refused: " << s.error_message() << "\n";
  }
  return 1;
}

void PrintSessions(const hsdp::v1::StatusResponse& r) {
  std::printf("%-8s %-20s %6s %6s %-8s %8s %8s %12s %10s %8s\n", "SESSION", "JOB", "RANK", "WORLD",
              "DEVICE", "PID", "BUFFERS", "BYTES", "OPS", "FAILED");
  for (const auto& s : r.sessions()) {
    std::printf("%-8llu %-20s %6d %6d %-8s %8lld %8u %12llu %10llu %8llu\n",
                static_cast<unsigned long long>(s.session_id()), s.job_id().c_str(), s.rank(),
                s.world_size(), s.device().c_str(), static_cast<long long>(s.pid()), s.buffers(),
                static_cast<unsigned long long>(s.buffer_bytes()),
                static_cast<unsigned long long>(s.ops_completed()),
                static_cast<unsigned long long>(s.ops_failed()));
  }
}

void PrintJobs(const hsdp::v1::StatusResponse& r) {
  std::printf("%-24s %6s %9s %7s\n", "JOB", "WORLD", "ATTACHED", "GROUPS");
  for (const auto& j : r.jobs()) {
    std::printf("%-24s %6d %9d %7u\n", j.job_id().c_str(), j.world_size(), j.attached_ranks(),
                j.groups());
  }
}

// `hsdpctl nodes`: 0 when the cluster is fine (or single node), 1 when this
// daemon sees it degraded or failed.
int Nodes(const std::shared_ptr<grpc::Channel>& channel,
          std::chrono::system_clock::time_point deadline, const std::string& socket, bool json) {
  auto stub = hsdp::v1::AdminCluster::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  hsdp::v1::NodesResponse r;
  grpc::Status s = stub->Nodes(&ctx, hsdp::v1::NodesRequest(), &r);
  if (!s.ok()) return Fail(socket, s);
  const bool bad = r.state() == "degraded" || r.state() == "failed";
  if (json) {
    std::cout << ToJson(r);
    return bad ? 1 : 0;
  }
  if (!r.enabled()) {
    std::printf("single node (no cluster.coordinator configured)\n");
    return 0;
  }
  std::printf("cluster %s, epoch %llu, this node %d of %u, coordinator %s%s\n", r.state().c_str(),
              static_cast<unsigned long long>(r.epoch()), r.node_rank(), r.expected_nodes(),
              r.coordinator().c_str(), r.is_coordinator() ? " (this node)" : "");
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
  std::string socket;
  std::string command;
  bool json = false;
  double timeout_s = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a.rfind("--socket=", 0) == 0) {
      socket = a.substr(9);
    } else if (a == "--json") {
      json = true;
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::atof(argv[++i]);
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (command.empty() && a[0] != '-') {
      command = a;
    } else {
      std::cerr << "hsdpctl: unexpected argument \"" << a << "\"\n" << kUsage;
      return 2;
    }
  }
  if (command.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  if (command != "status" && command != "sessions" && command != "jobs" && command != "config" &&
      command != "health" && command != "nodes") {
    std::cerr << "hsdpctl: unknown command \"" << command << "\"\n" << kUsage;
    return 2;
  }
  if (socket.empty()) socket = hsdp::ClientDefaultSocketPath();

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto channel = grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args);
  const auto deadline = absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_s));

  if (command == "health") {
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, req, &resp);
    if (!s.ok()) return Fail(socket, s);
    if (json) {
      std::cout << ToJson(resp);
    } else {
      std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
    }
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }

  if (command == "nodes") return Nodes(channel, deadline, socket, json);

  auto stub = hsdp::v1::Admin::NewStub(channel);
  if (command == "config") {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    hsdp::v1::GetConfigResponse resp;
    grpc::Status s = stub->GetConfig(&ctx, hsdp::v1::GetConfigRequest(), &resp);
    if (!s.ok()) return Fail(socket, s);
    std::cout << (json ? ToJson(resp) : resp.yaml());
    return 0;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  hsdp::v1::StatusResponse r;
  grpc::Status s = stub->Status(&ctx, hsdp::v1::StatusRequest(), &r);
  if (!s.ok()) return Fail(socket, s);
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
    std::printf("sessions %d, jobs %d, ops completed %llu, failed %llu, registered %llu bytes\n",
                r.sessions_size(), r.jobs_size(), static_cast<unsigned long long>(r.ops_completed()),
                static_cast<unsigned long long>(r.ops_failed()),
                static_cast<unsigned long long>(r.bytes_registered()));
    if (r.jobs_size() > 0) PrintJobs(r);
    if (r.sessions_size() > 0) PrintSessions(r);
  }
  return 0;
}
