// Fuzz target: the coordinator's Cluster service (daemon/cluster/
// cluster_service.h) as another daemon reaches it over TCP: each record is
// one call whose request is decoded from bytes as protobuf, as gRPC would,
// and handed to the real handler on a real Coordinator (3 nodes) and
// KvStore. The caller is authenticated (a peer holding the cluster token):
// what a node that is compromised or buggy can send.
//
// Records (fuzz_input.h), op % 10: 0 Join, 1 Heartbeat, 2 Report, 3 Set,
// 4 Get, 5 Wait, 6 Add, 7 Barrier, 8 Delete (payload: the request message),
// 9 time passes (payload[0] seconds on the coordinator's fake clock, then
// its liveness check: nodes are declared lost).
//
// Oracles beyond "no crash, no sanitizer report": every call finishes exactly
// once (waits and barriers by the end, when the store shuts down); the epoch
// never goes back; a node that joined can heartbeat at once as the rank and
// instance it was given, and its rank is one of the cluster's; a heartbeat
// answers events in order, after the cursor, at most kMaxEventsPerHeartbeat;
// the store never holds more keys than its limit.
#include <atomic>
#include <deque>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/auth/authenticator.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/kv_store.h"
#include "daemon/util/clock.h"
#include "fuzz_input.h"
#include "grpcpp/test/default_reactor_test_peer.h"

namespace hsdp::fuzz {
namespace {

constexpr char kSelf[] = "10.0.0.1:7070";

// A peer that presented the cluster token.
class TrustedPeer : public Authenticator {
 public:
  absl::StatusOr<PeerCred> Authenticate(const grpc::ServerContextBase&) const override {
    return PeerCred{};
  }
  bool IsAdmin(uint32_t) const override { return false; }
};

struct CallBase {
  grpc::CallbackServerContext ctx;
  std::atomic<int> finished{0};
  grpc::testing::DefaultReactorTestPeer peer{&ctx, [this](grpc::Status) { finished.fetch_add(1); }};
  virtual ~CallBase() = default;
};
template <typename Req, typename Resp>
struct Call : CallBase {
  Req req;
  Resp resp;
};

template <typename Req, typename Resp>
Call<Req, Resp>* Decode(std::string_view bytes, std::deque<std::unique_ptr<CallBase>>* calls) {
  auto c = std::make_unique<Call<Req, Resp>>();
  // A message that does not decode never reaches a handler (gRPC answers it).
  if (!c->req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return nullptr;
  calls->push_back(std::move(c));
  return static_cast<Call<Req, Resp>*>(calls->back().get());
}

KvLimits Limits() {
  KvLimits l;
  l.max_keys = 64;
  l.max_key_bytes = 256;
  l.max_value_bytes = 4096;
  l.max_total_bytes = 64 << 10;
  l.max_waiters = 16;
  l.max_wait_keys = 16;
  return l;
}

}  // namespace
}  // namespace hsdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsdp;
  using namespace hsdp::fuzz;
  static TrustedPeer auth;
  std::deque<std::unique_ptr<CallBase>> calls;
  {
    FakeClock clock;
    Coordinator::Options options{kSelf, 3, 1000, 5};
    options.clock = &clock;
    Coordinator coord(options);
    KvStore kv(Limits());
    ClusterServiceImpl svc(&auth, &coord, &kv, kSelf);
    uint64_t epoch = coord.epoch();
    Script script(data, size);
    Record r;
    for (int ops = 0; script.Next(&r) && ops < 64; ++ops) {
      switch (r.op % 10) {
        case 0:
          if (auto* c = Decode<v1::JoinRequest, v1::JoinResponse>(r.payload, &calls)) {
            svc.Join(&c->ctx, &c->req, &c->resp);
            if (c->peer.test_status().ok()) {
              HSDP_FUZZ_CHECK(c->resp.node_rank() >= 0 && c->resp.node_rank() < 3,
                              absl::StrCat("rank ", c->resp.node_rank()));
              v1::HeartbeatRequest hb;
              hb.set_node_rank(c->resp.node_rank());
              hb.set_instance(c->req.instance());
              auto again = coord.Heartbeat(hb);
              HSDP_FUZZ_CHECK(again.ok(), "a node that just joined cannot heartbeat: " +
                                              again.status().ToString());
            }
          }
          break;
        case 1:
          if (auto* c = Decode<v1::HeartbeatRequest, v1::HeartbeatResponse>(r.payload, &calls)) {
            svc.Heartbeat(&c->ctx, &c->req, &c->resp);
            if (c->peer.test_status().ok()) {
              HSDP_FUZZ_CHECK(static_cast<size_t>(c->resp.events_size()) <=
                                  Coordinator::kMaxEventsPerHeartbeat,
                              "too many events in one heartbeat");
              uint64_t last = c->req.events_after() > c->resp.events_last() ? 0 : c->req.events_after();
              for (const v1::GroupEvent& e : c->resp.events()) {
                HSDP_FUZZ_CHECK(e.seq() > last, "events out of order or before the cursor");
                last = e.seq();
              }
              HSDP_FUZZ_CHECK(last <= c->resp.events_last(), "an event after events_last");
            }
          }
          break;
        case 2:
          if (auto* c = Decode<v1::ReportRequest, v1::ReportResponse>(r.payload, &calls)) {
            svc.Report(&c->ctx, &c->req, &c->resp);
          }
          break;
        case 3:
          if (auto* c = Decode<v1::KvSetRequest, v1::KvSetResponse>(r.payload, &calls)) {
            svc.Set(&c->ctx, &c->req, &c->resp);
          }
          break;
        case 4:
          if (auto* c = Decode<v1::KvGetRequest, v1::KvGetResponse>(r.payload, &calls)) {
            svc.Get(&c->ctx, &c->req, &c->resp);
          }
          break;
        case 5:
          if (auto* c = Decode<v1::KvWaitRequest, v1::KvWaitResponse>(r.payload, &calls)) {
            svc.Wait(&c->ctx, &c->req, &c->resp);
          }
          break;
        case 6:
          if (auto* c = Decode<v1::KvAddRequest, v1::KvAddResponse>(r.payload, &calls)) {
            svc.Add(&c->ctx, &c->req, &c->resp);
          }
          break;
        case 7:
          if (auto* c = Decode<v1::BarrierRequest, v1::BarrierResponse>(r.payload, &calls)) {
            svc.Barrier(&c->ctx, &c->req, &c->resp);
          }
          break;
        case 8:
          if (auto* c = Decode<v1::KvDeleteRequest, v1::KvDeleteResponse>(r.payload, &calls)) {
            svc.Delete(&c->ctx, &c->req, &c->resp);
          }
          break;
        case 9:
          clock.Advance(absl::ToInt64Nanoseconds(
              absl::Seconds(r.payload.empty() ? 1 : static_cast<uint8_t>(r.payload[0]))));
          coord.CheckLiveness();
          break;
      }
      HSDP_FUZZ_CHECK(coord.epoch() >= epoch, "the epoch went back");
      epoch = coord.epoch();
      HSDP_FUZZ_CHECK(kv.key_count() <= Limits().max_keys, "more keys than the limit");
    }
    kv.Shutdown();
  }
  for (const auto& c : calls) {
    HSDP_FUZZ_CHECK(c->finished.load() == 1,
                    absl::StrCat("a call finished ", c->finished.load(), " times"));
  }
  return 0;
}
