#include "daemon/engine/nccl/nccl_engine.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/nccl/nccl_engine_state.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp::nccl {
namespace {

constexpr size_t kMaxRememberedTickets = 4096;

}  // namespace

NcclEngine::NcclEngine(device::DeviceApi* dev, Collectives* coll, NcclEngineOptions options)
    : dev_(dev), coll_(coll), options_(options), gate_(dev, options_.op_timeout) {
  thread_ = std::thread([this] { Loop(); });
}

NcclEngine::~NcclEngine() { Shutdown(); }

absl::Status NcclEngine::ValidateTask(const EngineTask& t, int device_count, bool cross_node) {
  switch (t.collective) {
    case Collective::kAllReduce:
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kBroadcast:
    case Collective::kBarrier:
    case Collective::kAllToAll:
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("the nccl engine does not run collective ", static_cast<int>(t.collective)));
  }
  bool all_local = true, any_local = false;
  for (const EngineMember& m : t.members) {
    all_local = all_local && m.local;
    any_local = any_local || m.local;
  }
  if (!all_local && !cross_node) {
    return absl::UnimplementedError(
        "the nccl engine of this hsdpd runs groups whose members are all on this node (it is "
        "not part of a cluster)");
  }
  if (!any_local) return absl::InvalidArgumentError("task has no member on this node");
  if (t.members.empty()) return absl::InvalidArgumentError("task has no members");
  if (t.collective == Collective::kBroadcast &&
      (t.root < 0 || t.root >= static_cast<int>(t.members.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", t.root, " is out of range"));
  }
  if (t.collective == Collective::kBarrier) return absl::OkStatus();
  if (DataTypeSize(t.spec.dtype) == 0) return absl::InvalidArgumentError("invalid dtype");
  std::set<int> devices;
  for (size_t i = 0; i < t.members.size(); ++i) {
    const EngineMember& m = t.members[i];
    if (!m.local) continue;  // its own daemon checks it
    if (m.send.kind != MemoryKind::kDevice || m.recv.kind != MemoryKind::kDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", m.global_rank, ": the nccl engine runs on device buffers only"));
    }
    if (m.send.device != m.recv.device || m.send.device < 0 || m.send.device >= device_count) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", m.global_rank, ": device ",
                                                     m.send.device, "/", m.recv.device,
                                                     " is not one device of the ", device_count,
                                                     " this daemon sees"));
    }
    // Members sharing a GPU run on hsdpd's own intra-device kernels plus one
    // NCCL rank per device; that needs to know every member's device, so
    // only when all members are on this node.
    if (!devices.insert(m.send.device).second && !all_local) {
      return absl::UnimplementedError(absl::StrCat(
          "rank ", m.global_rank, " shares device ", m.send.device,
          " with another member of a group that spans nodes; several members per GPU are "
          "supported only when every member of the group is on this node"));
    }
  }
  if (Reduces(t.collective)) {
    RETURN_IF_ERROR(PlanReduce(t.spec, static_cast<int>(t.members.size())).status());
  }
  return absl::OkStatus();
}

absl::Status NcclEngine::CreateGroup(const EngineGroupSpec& spec) {
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) return absl::UnavailableError("hsdpd is shutting down");
  control_.push_back(Control{Control::kCreate, spec, spec.key, 0, absl::OkStatus()});
  cv_.notify_all();
  return absl::OkStatus();
}

void NcclEngine::DestroyGroup(const std::string& key) {
  std::lock_guard<std::mutex> l(mu_);
  control_.push_back(Control{Control::kDestroy, {}, key, 0, absl::OkStatus()});
  cv_.notify_all();
}

uint64_t NcclEngine::Launch(EngineTask task, EngineCallbacks cb) {
  uint64_t ticket;
  absl::Status refused;
  {
    std::lock_guard<std::mutex> l(mu_);
    ticket = next_ticket_++;
    if (stopping_) {
      refused = absl::UnavailableError("hsdpd is shutting down");
    } else {
      refused = ValidateTask(task, dev_->DeviceCount(), options_.exchange_id != nullptr);
    }
    if (refused.ok()) {
      queue_.push_back(
          Queued{ticket, std::move(task), std::move(cb), absl::Now() + options_.op_timeout});
      cv_.notify_all();
      return ticket;
    }
    failed_[ticket] = refused;
    ++stats_.tasks_failed;
  }
  cb.launched(ticket);
  cb.completed(refused, 0);
  return ticket;
}

void NcclEngine::Abort(uint64_t ticket, const absl::Status& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (ticket == 0 || ticket >= next_ticket_) return;
  control_.push_back(Control{Control::kAbort, {}, "", ticket, why});
  cv_.notify_all();
}

void NcclEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && !thread_.joinable()) return;
    if (!stopping_) stop_deadline_ = absl::Now() + options_.shutdown_grace;
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

NcclEngineStats NcclEngine::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  NcclEngineStats s = stats_;
  s.gated_tasks = gated_tasks_.load(std::memory_order_relaxed);
  return s;
}

device::StreamHandle NcclEngine::StreamOf(const std::string& group_key, int device,
                                          bool high) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = stream_index_.find({group_key, device, high});
  return it == stream_index_.end() ? 0 : it->second;
}

void NcclEngine::Loop() {
#ifdef PR_SET_TIMERSLACK
  // The timed polls below are tens of microseconds: without this the
  // kernel's default slack (50 us) doubles them.
  (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
  absl::Time last_progress = absl::InfinitePast();
  for (;;) {
    std::deque<Control> controls;
    std::deque<Queued> tasks;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (queue_.empty() && control_.empty()) {
        if (running_.empty() && gate_.empty() && draining_.empty()) {
          if (stopping_) break;
          cv_.wait(l, [&] { return stopping_ || !queue_.empty() || !control_.empty(); });
        } else if (absl::Now() - last_progress < options_.spin_window) {
          l.unlock();
          sched_yield();  // spin: poll again at once, letting others run
          l.lock();
        } else {
          cv_.wait_for(l, absl::ToChronoMicroseconds(options_.poll_interval));
        }
      }
      controls.swap(control_);
      tasks.swap(queue_);
    }
    const size_t in_flight = running_.size() + gate_.groups();
    if (!tasks.empty()) last_progress = absl::Now();
    // New tasks enter the gate first, so an Abort that came with them finds
    // them; controls run before anything is issued, so a CreateGroup queued
    // before a Launch is seen by it.
    for (Queued& q : tasks) gate_.Add(std::move(q));
    for (const Control& c : controls) RunControl(c);
    ReleaseGated();
    Poll();
    PollDraining();
    gated_tasks_.store(gate_.tasks(), std::memory_order_relaxed);
    if (running_.size() + gate_.groups() < in_flight + tasks.size()) last_progress = absl::Now();
  }
  // Stopped and drained: release everything (device memory only once the
  // work that may touch it has passed, with a bound).
  for (auto& [key, set] : sets_) ReleaseSet(set, !set->broken.ok());
  sets_.clear();
  FreeRetired(/*final=*/true);
}

void NcclEngine::RetireBehind(device::EventHandle marker, std::vector<device::DevicePtr> ptrs,
                              std::vector<device::StreamHandle> streams) {
  retired_.push_back(Retired{marker, std::move(ptrs), std::move(streams)});
}

void NcclEngine::FreeRetired(bool final) {
  const absl::Time deadline = absl::Now() + (final ? options_.shutdown_grace : absl::ZeroDuration());
  for (;;) {
    for (auto it = retired_.begin(); it != retired_.end();) {
      bool done = it->after == 0;
      if (!done) {
        absl::StatusOr<bool> ok = dev_->EventDone(it->after);
        done = !ok.ok() || *ok;  // failed work is over too
      }
      if (!done) {
        ++it;
        continue;
      }
      for (device::DevicePtr p : it->ptrs) (void)dev_->Free(p);
      for (device::StreamHandle s : it->streams) dev_->DestroyStream(s);
      if (it->after != 0) dev_->DestroyEvent(it->after);
      it = retired_.erase(it);
    }
    if (!final || retired_.empty()) return;
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  // Work that never finished may still touch these buffers: leave them
  // allocated (a leak, never a use after free); streams are released without
  // waiting (their queued work still runs).
  for (Retired& r : retired_) {
    HSDP_LOG(Warning) << "device work behind a released communicator set did not finish; "
                      << r.ptrs.size() << " scratch buffers are left allocated";
    for (device::StreamHandle s : r.streams) dev_->DestroyStream(s);
  }
  retired_.clear();
}

void NcclEngine::RunControl(const Control& c) {
  switch (c.kind) {
    case Control::kCreate: {
      // Older epochs are retired when the new epoch's communicators exist
      // (they may be shrunk from a healthy old epoch).
      groups_[c.spec.key] = c.spec;
      break;
    }
    case Control::kDestroy: {
      groups_.erase(c.key);
      for (auto& [key, set] : sets_) {
        if (set->group_key == c.key || set->group_key == c.key + "/p2p") set->retire = true;
      }
      break;
    }
    case Control::kAbort: {
      auto it = running_.find(c.ticket);
      if (it != running_.end()) {
        FailSet(it->second->set, c.why);
        break;
      }
      if (AbortGated(c.ticket, c.why)) break;
      std::optional<Queued> dropped;
      {
        std::lock_guard<std::mutex> l(mu_);
        for (auto q = queue_.begin(); q != queue_.end(); ++q) {
          if (q->ticket == c.ticket) {
            dropped = std::move(*q);
            queue_.erase(q);
            failed_[c.ticket] = c.why;
            break;
          }
        }
      }
      if (dropped.has_value()) {
        dropped->cb.launched(dropped->ticket);
        dropped->cb.completed(c.why, 0);
      }
      break;
    }
  }
  ReleaseRetired();
}

void NcclEngine::ReleaseRetired() {
  for (auto it = sets_.begin(); it != sets_.end();) {
    if (it->second->retire && it->second->running.empty()) {
      ReleaseSet(it->second, !it->second->broken.ok());
      it = sets_.erase(it);
    } else {
      ++it;
    }
  }
}

void NcclEngine::ReleaseSet(const std::shared_ptr<CommSet>& set, bool abort) {
  // All of the set's communicators in one call (one group call: several
  // local ranks ended one at a time from this thread would hang NCCL).
  std::vector<CommHandle> comms;
  for (CommHandle c : set->comms) {
    if (c != 0) comms.push_back(c);
  }
  set->comms.clear();
  if (!comms.empty()) {
    if (absl::Status s = coll_->Release(comms, abort); !s.ok()) {
      HSDP_LOG(Warning) << (abort ? "aborting" : "destroying") << " the communicators of "
                        << set->group_key << " epoch " << set->epoch << ": " << s.message();
    }
  }
  // Each stream and its scratch buffers go once the stream passed a marker
  // recorded behind its last work (which may still run: an aborted kernel
  // ending, a cast-out after it).
  for (auto& [dh, stream] : set->streams) {
    std::vector<device::DevicePtr> ptrs;
    for (auto& [k, b] : set->scratch) {
      if (k.first == stream && b.ptr != 0) ptrs.push_back(b.ptr);
    }
    absl::StatusOr<device::EventHandle> marker = dev_->CreateEvent(dh.first, false);
    if (marker.ok() && dev_->RecordEvent(*marker, stream).ok()) {
      RetireBehind(*marker, std::move(ptrs), {stream});
    } else {
      // No marker: the buffers may still be in use; leave them allocated.
      if (marker.ok()) dev_->DestroyEvent(*marker);
      HSDP_LOG(Warning) << "no marker event for a released stream; " << ptrs.size()
                        << " scratch buffers are left allocated";
      RetireBehind(0, {}, {stream});
    }
  }
  set->scratch.clear();
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = stream_index_.begin(); it != stream_index_.end();) {
      bool ours = false;
      for (auto& [dh, stream] : set->streams) ours = ours || it->second == stream;
      it = ours ? stream_index_.erase(it) : std::next(it);
    }
  }
  set->streams.clear();
}

void NcclEngine::Poll() {
  // Asynchronous communicator errors (a lost peer) first.
  std::vector<std::pair<std::shared_ptr<CommSet>, absl::Status>> broken;
  for (auto& [key, set] : sets_) {
    if (!set->broken.ok() || set->running.empty()) continue;
    for (CommHandle c : set->comms) {
      absl::Status err;
      if (coll_->Query(c, &err) == AsyncState::kFailed) {
        broken.emplace_back(set, absl::Status(err.code(), absl::StrCat(
                                                  "communicator error in group ", set->group_key,
                                                  ": ", err.message())));
        break;
      }
    }
  }
  for (auto& [set, why] : broken) FailSet(set, why);
  absl::Time now = absl::Now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && now > stop_deadline_) now = absl::InfiniteFuture();  // everything is late
  }
  std::vector<uint64_t> done, late;
  std::vector<std::pair<uint64_t, absl::Status>> errored;
  for (auto& [ticket, run] : running_) {
    bool all = true;
    absl::Status err;
    for (auto& [d, e] : run->done) {
      absl::StatusOr<bool> ok = dev_->EventDone(e);
      if (!ok.ok()) {
        err = ok.status();
        break;
      }
      all = all && *ok;
    }
    // A dependent is reported after what it depends on (its work ran after
    // it on the device, but the events are polled one by one).
    bool deps_reported = true;
    for (uint64_t dep : run->task.depends_on) {
      if (running_.count(dep) != 0 &&
          std::find(done.begin(), done.end(), dep) == done.end()) {
        deps_reported = false;
      }
    }
    if (!err.ok()) {
      errored.emplace_back(ticket, err);
    } else if (all && deps_reported) {
      done.push_back(ticket);
    } else if (now > run->deadline) {
      late.push_back(ticket);
    }
  }
  for (uint64_t t : done) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    std::unique_ptr<Running> run = std::move(it->second);
    running_.erase(it);
    Finish(std::move(run), absl::OkStatus());
  }
  for (auto& [t, err] : errored) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    if (it->second->set != nullptr) {
      FailSet(it->second->set, err);
    } else {
      std::unique_ptr<Running> run = std::move(it->second);
      running_.erase(it);
      Drain(std::move(run), err);
    }
  }
  for (uint64_t t : late) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    const absl::Status why =
        now == absl::InfiniteFuture()
            ? absl::UnavailableError(absl::StrCat(
                  "hsdpd is shutting down: ", CollName(it->second->task.collective),
                  " in group ", it->second->task.group_key,
                  " was still running after the grace period; its communicators were aborted"))
            : absl::DeadlineExceededError(absl::StrCat(
                  CollName(it->second->task.collective), " in group ",
                  it->second->task.group_key, " did not finish within ",
                  absl::FormatDuration(options_.op_timeout), "; its communicators were aborted"));
    if (it->second->set != nullptr) {
      FailSet(it->second->set, why);
    } else {
      std::unique_ptr<Running> run = std::move(it->second);
      running_.erase(it);
      Drain(std::move(run), why);
    }
  }
  FreeRetired(/*final=*/false);
  ReleaseRetired();
  std::lock_guard<std::mutex> l(mu_);
  busy_ = !running_.empty();
}

void NcclEngine::FailSet(const std::shared_ptr<CommSet>& set, const absl::Status& why) {
  if (set == nullptr) return;
  if (set->broken.ok()) {
    set->broken = why;
    HSDP_LOG(Warning) << "aborting the communicators of " << set->group_key << " epoch "
                      << set->epoch << ": " << why.message();
    ReleaseSet(set, /*abort=*/true);
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.comm_aborts;
  }
  const std::set<uint64_t> tickets = set->running;
  for (uint64_t t : tickets) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    std::unique_ptr<Running> run = std::move(it->second);
    running_.erase(it);
    Drain(std::move(run), why);
  }
}

void NcclEngine::Finish(std::unique_ptr<Running> run, absl::Status status) {
  if (run->set != nullptr) run->set->running.erase(run->ticket);
  // An aborted task's events may never complete (fake streams: they will,
  // once the abort released them); destroying an event is always safe.
  for (auto& [d, e] : run->done) dev_->DestroyEvent(e);
  const uint64_t exec_ns = static_cast<uint64_t>(shm::NowNanos() - run->start_ns);
  {
    std::lock_guard<std::mutex> l(mu_);
    // A dependency that failed after this task was issued (the device only
    // waited for its events, which an abort still completes) fails it too.
    for (uint64_t dep : run->task.depends_on) {
      if (auto it = failed_.find(dep); status.ok() && it != failed_.end()) {
        status = absl::Status(it->second.code(),
                              absl::StrCat("an operation this one depends on failed: ",
                                           it->second.message()));
      }
    }
    if (status.ok()) {
      ++stats_.tasks_completed;
    } else {
      ++stats_.tasks_failed;
      failed_[run->ticket] = status;
      while (failed_.size() > kMaxRememberedTickets) failed_.erase(failed_.begin());
    }
  }
  run->cb.completed(std::move(status), exec_ns);
}

}  // namespace hsdp::nccl
