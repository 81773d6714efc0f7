#include "daemon/cluster/etcd/etcd_client_internal.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hsdp::etcd::internal {

bool IsStaleToken(const grpc::Status& s) {
  return (s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
          absl::StrContains(s.error_message(), "invalid auth token")) ||
         absl::StrContains(s.error_message(), "revision of auth store is old");
}

absl::StatusCode ToAbsl(grpc::StatusCode code) { return static_cast<absl::StatusCode>(code); }

std::string Quote(const std::string& key) { return absl::StrCat("\"", absl::CHexEscape(key), "\""); }

std::string RangeText(const std::string& key, const std::string& range_end) {
  if (range_end.empty()) return Quote(key);
  return absl::StrCat("[", Quote(key), ", ", Quote(range_end), ")");
}

absl::Status ValidateEndpoint(const std::string& ep) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint \"", absl::CHexEscape(ep), "\": ", why,
                     " (expected HOST:PORT, e.g. 127.0.0.1:2379)"));
  };
  if (ep.empty()) return bad("empty");
  if (absl::StrContains(ep, "://")) return bad("a URL; give HOST:PORT without a scheme");
  for (char c : ep) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || c == '/' ||
        !absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return bad("contains a space, a slash or a control character");
    }
  }
  const size_t colon = ep.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  const std::string host = ep.substr(0, colon);
  const std::string port = ep.substr(colon + 1);
  if (host.empty()) return bad("no host");
  if (host.front() == '[' ? host.back() != ']' || host.size() < 3
                          : absl::StrContains(host, ':') || absl::StrContains(host, ']')) {
    return bad("malformed host (an IPv6 address needs brackets: [::1]:2379)");
  }
  int value = 0;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
    return bad("the port must be a number in 1..65535");
  }
  return absl::OkStatus();
}

KeyValue FromPb(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

void ToPb(const Compare& c, pb::Compare* out) {
  out->set_key(c.key);
  switch (c.result) {
    case Compare::Result::kEqual: out->set_result(pb::Compare::EQUAL); break;
    case Compare::Result::kGreater: out->set_result(pb::Compare::GREATER); break;
    case Compare::Result::kLess: out->set_result(pb::Compare::LESS); break;
    case Compare::Result::kNotEqual: out->set_result(pb::Compare::NOT_EQUAL); break;
  }
  switch (c.target) {
    case Compare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(c.number);
      break;
    case Compare::Target::kCreate:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case Compare::Target::kMod:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(c.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(c.number);
      break;
  }
}

void ToPb(const Op& op, pb::RequestOp* out) {
  switch (op.kind) {
    case Op::Kind::kPut: {
      pb::PutRequest* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case Op::Kind::kRange: {
      pb::RangeRequest* range = out->mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(op.range_end);
      break;
    }
    case Op::Kind::kDelete: {
      pb::DeleteRangeRequest* del = out->mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(op.range_end);
      break;
    }
  }
}

}  // namespace hsdp::etcd::internal
