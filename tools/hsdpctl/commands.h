// hsdpctl's observability commands (trace, stragglers, top) and what they
// share with main.cc. Each command returns the process exit code: 0 success,
// 1 the daemon is down or refused, 2 bad usage.
#ifndef HSDP_TOOLS_HSDPCTL_COMMANDS_H_
#define HSDP_TOOLS_HSDPCTL_COMMANDS_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "hsdp/v1/admin.grpc.pb.h"

namespace hsdpctl {

struct Context {
  std::string socket;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<hsdp::v1::Admin::Stub> admin;
  bool json = false;
  double timeout_s = 5;
  bool timeout_given = false;  // --timeout on the command line (drain: how long to wait)
  // Command options.
  double seconds = 5;     // trace: how long to record
  std::string output;     // trace: file to write ("-" = stdout)
  std::string job;        // trace, stragglers: only this job
  double interval_s = 1;  // top: refresh period
  int iterations = 0;     // top: refreshes before exiting (0 = until interrupted)
};

// A ClientContext with the --timeout deadline (or `seconds` when > 0).
void SetDeadline(grpc::ClientContext* ctx, const Context& c, double seconds = 0);
// Prints why the RPC failed; returns 1.
int Fail(const Context& c, const grpc::Status& s);
std::string ToJson(const google::protobuf::Message& m);

int RunTrace(Context& c);
int RunStragglers(Context& c);
int RunTop(Context& c);

}  // namespace hsdpctl

#endif  // HSDP_TOOLS_HSDPCTL_COMMANDS_H_
