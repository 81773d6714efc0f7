#include "daemon/dataplane/dispatcher.h"


#include "daemon/dataplane/validate.h"
#include "hsdp/common/logging.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {
constexpr int64_t kTickNs = 20'000'000;  // timeouts and housekeeping every 20 ms

// An operation popped from a session the daemon is ending.
absl::Status NotStartedSessionEnding() {
  return absl::UnavailableError(
      "hsdpd ended this session before this operation started; submit it again once "
      "reconnected");
}
}  // namespace

uint32_t ParseSpinMode(const std::string& name) {
  return name == "pause" ? shm::kSpinPause : shm::kSpinYield;
}

Dispatcher::Dispatcher(SessionDirectory* directory, const WakeFd* wake, int64_t spin_ns,
                       const DeviceBufferRegistry* device_buffers, uint32_t spin_mode)
    : directory_(directory), device_buffers_(device_buffers), wake_(wake), spin_ns_(spin_ns),
      spin_mode_(spin_mode) {}

Dispatcher::~Dispatcher() { Stop(); }

void Dispatcher::Start() { thread_ = std::thread([this] { Loop(); }); }

void Dispatcher::Stop() {
  stop_.store(true);
  wake_->Wake();
  if (thread_.joinable()) thread_.join();
}

void Dispatcher::Handle(const std::shared_ptr<Session>& session, const shm::OpDescriptor& d) {
  const int64_t now = shm::NowNanos();
  const bool within_job_limit = session->BeginOp();
  auto fail_alone = [&](const absl::Status& s) {
    HSDP_LOG_EVERY_N_SEC(Warning, 1)
        << "session " << session->id() << " op " << d.op_id << ": " << s.message();
    session->Complete(d.op_id, s, 0, 0);
  };
  // The session is ending, its groups going with it (a drain ends every
  // session the moment the last operation completed): this operation never
  // starts, and the client, which may still read this completion, submits it
  // again after it reconnected (not "unknown group", which it would take for
  // its own bug). Looked at again after a failed lookup: MarkEnding comes
  // before the groups go.
  auto ended = [&] { return fail_alone(NotStartedSessionEnding()); };
  if (session->ending()) return ended();
  // A client cannot have more operations outstanding than its ring has
  // completion slots; one that pushes more anyway is refused here, so the
  // daemon's memory per session stays bounded.
  if (session->ops_in_flight() > int64_t{session->channel().ring_entries()}) {
    return fail_alone(absl::ResourceExhaustedError(absl::StrCat(
        "session ", session->id(), " has more than ", session->channel().ring_entries(),
        " operations outstanding (its ring size); wait for completions before submitting more")));
  }
  std::shared_ptr<Group> group = directory_->FindGroup(d.group_id);
  if (group == nullptr && session->ending()) return ended();
  if (group == nullptr || group->job().owner_uid != session->info().owner_uid ||
      group->job().name != session->info().job_id) {
    return fail_alone(absl::InvalidArgumentError(
        absl::StrCat("group_id: unknown group ", d.group_id)));
  }
  const int rank = group->RankOf(session->info().rank);
  if (rank < 0 || !group->IsMember(rank, session.get())) {
    if (session->ending()) return ended();
    return fail_alone(absl::InvalidArgumentError(absl::StrCat(
        "group_id: session ", session->id(), " is not a member of group ", d.group_id)));
  }
  Arrival a;
  a.session = session;
  a.desc = d;
  a.epoch = d.epoch;
  a.seq = d.seq;
  a.first_ns = now;
  // Over the job's limit: refused as an arrival, so the group fails every
  // member of this operation at once instead of leaving the others waiting.
  a.rejected = within_job_limit
                   ? ValidateFields(d, session->info().features)
                   : absl::ResourceExhaustedError(absl::StrCat(
                         session->info().job().Describe(), " has more than ",
                         session->job_op_count()->limit,
                         " operations in flight on this node (limits.max_job_ops_in_flight)"));
  if (a.rejected.ok() && draining_.load(std::memory_order_relaxed)) {
    a.rejected = absl::UnavailableError(
        "hsdpd is draining for a restart (hsdpctl drain): this operation was not started; "
        "submit it again once the daemon is back");
  }
  if (a.rejected.ok() && static_cast<Collective>(d.collective) == Collective::kReduceScatterAllReduce) {
    std::shared_ptr<Group> g2 = directory_->FindGroup(d.group2_id);
    const int r2 = g2 != nullptr ? g2->RankOf(session->info().rank) : -1;
    if (r2 < 0 || !g2->IsMember(r2, session.get())) {
      a.rejected = session->ending()
                       ? NotStartedSessionEnding()
                       : absl::InvalidArgumentError(absl::StrCat("group2_id: session ",
                                                                 session->id(),
                                                                 " is not a member of group ",
                                                                 d.group2_id));
    }
  }
  if (a.rejected.ok()) {
    a.rejected = ResolveBuffers(d, rank, group->size(), *session, device_buffers_, &a);
  }
  group->Arrive(rank, std::move(a));
}

bool Dispatcher::DrainAll() {
  bool any = false;
  for (const std::shared_ptr<Session>& s : sessions_) {
    if (s->closed() || !s->data_connected()) continue;
    shm::OpDescriptor d;
    // Bounded per session per pass, so one busy client cannot starve others.
    for (int i = 0; i < 64; ++i) {
      const ShmChannel::PopResult r = s->channel().Pop(&d);
      if (r == ShmChannel::PopResult::kEmpty) break;
      any = true;
      if (r == ShmChannel::PopResult::kCorrupt) {
        HSDP_LOG(Error) << "session " << s->id() << ": ring indices corrupted; ending session";
        directory_->EndSession(s->id(), "its shared-memory ring was corrupted");
        break;
      }
      Handle(s, d);
    }
  }
  return any;
}

void Dispatcher::Loop() {
  int64_t next_tick = shm::NowNanos() + kTickNs;
  while (!stop_.load()) {
    if (directory_->version() != seen_version_) {
      seen_version_ = directory_->version();
      sessions_ = directory_->Snapshot();
      for (const std::shared_ptr<Session>& s : sessions_) s->channel().SetSpinMode(spin_mode_);
    }
    const bool any = DrainAll();
    const int64_t now = shm::NowNanos();
    if (now >= next_tick) {
      for (const std::shared_ptr<Group>& g : directory_->AllGroups()) g->CheckTimeouts(now);
      directory_->Housekeeping();
      next_tick = now + kTickNs;
    }
    if (any) continue;
    Idle(next_tick);
  }
}

bool Dispatcher::AnyWork() const {
  if (stop_.load(std::memory_order_relaxed) || directory_->version() != seen_version_) return true;
  for (const std::shared_ptr<Session>& s : sessions_) {
    if (s->channel().HasWork()) return true;
  }
  return false;
}

void Dispatcher::Idle(int64_t deadline_ns) {
  const int64_t spin_until = shm::NowNanos() + spin_ns_;
  // As the clients' waits (shm::AwaitDoorbell): pause first, then yield
  // between polls, so a client sharing this CPU can submit.
  for (uint32_t i = 1;; ++i) {
    if (AnyWork()) return;
    if (shm::SpinOnce(spin_mode_, i) || (i & 63) == 0) {
      const int64_t now = shm::NowNanos();
      if (now >= deadline_ns) return;
      if (now >= spin_until) break;
    }
  }
  // Publish "sleeping", then look once more: a client either sees the flag
  // (and kicks the eventfd, which stays readable) or its push is seen here.
  for (const std::shared_ptr<Session>& s : sessions_) s->channel().SetDaemonSleeping(true);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!AnyWork()) wake_->Wait(deadline_ns - shm::NowNanos());
  for (const std::shared_ptr<Session>& s : sessions_) s->channel().SetDaemonSleeping(false);
}

}  // namespace hsdp
