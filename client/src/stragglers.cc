#include "hsdp/stragglers.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/socket_path.h"
#include "hsdp/v1/admin.grpc.pb.h"

namespace hsdp {

absl::StatusOr<StragglerReport> QueryStragglers(const std::string& socket_path,
                                                const std::string& job_id, absl::Duration timeout) {
  const std::string path = socket_path.empty() ? ClientDefaultSocketPath() : socket_path;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto channel =
      grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::StragglersRequest req;
  req.set_job_id(job_id);
  v1::StragglersResponse resp;
  const grpc::Status s = stub->Stragglers(&ctx, req, &resp);
  if (!s.ok()) {
    const auto code = static_cast<absl::StatusCode>(s.error_code());
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(
          absl::StrCat("Stragglers: hsdpd unavailable on ", path, ": ", s.error_message()));
    }
    return absl::Status(code, s.error_message());
  }
  StragglerReport out;
  for (const v1::StragglerJob& j : resp.jobs()) out.ops_matched[j.job_id()] = j.ops_matched();
  for (const v1::StragglerRank& r : resp.ranks()) {
    StragglerRank sr;
    sr.job_id = r.job_id();
    sr.owner_uid = r.owner_uid();
    sr.rank = r.rank();
    sr.times_last = r.times_last();
    sr.waited_seconds_total = r.waited_seconds_total();
    sr.p50_seconds = r.p50_seconds();
    sr.p90_seconds = r.p90_seconds();
    sr.p99_seconds = r.p99_seconds();
    sr.max_seconds = r.max_seconds();
    for (const v1::StragglerOp& o : r.recent()) {
      sr.recent.push_back(StragglerOp{o.event_id(), o.group_id(), o.op(), o.seq(), o.epoch(),
                                      o.waited_seconds(), o.age_seconds()});
    }
    out.ranks.push_back(std::move(sr));
  }
  return out;
}

}  // namespace hsdp
