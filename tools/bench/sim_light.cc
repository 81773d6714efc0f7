#include "tools/bench/sim_light.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cluster/member_status.h"

namespace hsdp::sim {

LightFleet::LightFleet(Options options)
    : options_(std::move(options)), members_(new Member[options_.count]) {
  for (int i = 0; i < options_.count; ++i) members_[i].instance = NewInstanceId();
}

LightFleet::~LightFleet() { Stop(); }

std::string LightFleet::address(int i) const {
  return absl::StrCat("127.0.0.1:", options_.first_port + i);
}

CoordinatorFleet::CoordinatorFleet(const std::string& coordinator, Options options)
    : LightFleet(std::move(options)), state_(new State[this->options().count]) {
  for (int c = 0; c < std::max(1, this->options().channels); ++c) {
    clients_.push_back(std::make_unique<ClusterClient>(coordinator, ""));
  }
}

absl::Status CoordinatorFleet::JoinOnce(int i, absl::Duration timeout) {
  Member& m = member(i);
  State& st = state_[i];
  v1::JoinRequest req;
  req.set_address(address(i));
  req.set_data_address("127.0.0.1");
  req.set_name(absl::StrCat("light", i));
  req.set_requested_rank(-1);
  req.set_nodes(options().cluster_nodes);
  req.set_instance(m.instance);
  req.set_last_epoch(st.epoch);
  req.set_list_optional(true);
  CountCall();
  absl::StatusOr<v1::JoinResponse> r = ClientOf(i).Join(req, timeout);
  if (!r.ok()) return r.status();
  if (r->node_rank() < 0 || static_cast<uint32_t>(r->node_rank()) >= options().cluster_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r->node_rank(), " out of range"));
  }
  m.rank = r->node_rank();
  st.epoch = r->epoch();
  st.events_after = r->events_last();
  return absl::OkStatus();
}

bool CoordinatorFleet::BeatOnce(int i, absl::Duration timeout) {
  Member& m = member(i);
  State& st = state_[i];
  v1::HeartbeatRequest req;
  req.set_node_rank(m.rank);
  req.set_instance(m.instance);
  req.set_events_after(st.events_after);
  req.set_nodes_epoch(st.epoch);
  req.set_news_only(true);  // as a real member's sparse view asks
  CountCall();
  absl::StatusOr<v1::HeartbeatResponse> r = ClientOf(i).Heartbeat(req, timeout);
  if (r.ok()) {
    st.epoch = r->epoch();  // the delta is dropped: this member keeps no list
    st.events_after = r->events_last();
    return true;
  }
  if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
    CountRejoin();
    (void)JoinOnce(i, timeout);
  }
  return false;
}

bool LightFleet::SleepUntil(int thread, absl::Time until) {
  Sleeper& s = *sleepers_[thread];
  std::unique_lock<std::mutex> l(s.mu);
  auto stopping = [&] { return stop_.load(std::memory_order_relaxed); };
  if (until == absl::InfiniteFuture()) {
    s.cv.wait(l, stopping);
  } else {
    s.cv.wait_until(l, absl::ToChronoTime(until),
                    [&] { return stopping() || absl::Now() >= until; });
  }
  return stop_.load(std::memory_order_relaxed);
}

absl::Status LightFleet::JoinWithRetries(int thread, int i) {
  const absl::Time deadline = absl::Now() + options_.join_timeout;
  absl::Status last = absl::DeadlineExceededError("join_timeout");
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return last;
    last = JoinOnce(i, std::min(left, absl::Seconds(5)));
    if (last.ok() || PermanentJoinError(last)) return last;
    if (SleepUntil(thread, absl::Now() + absl::Milliseconds(100))) {
      return absl::CancelledError("stopped");
    }
  }
}

bool LightFleet::WaitJoined(absl::Time deadline, int* joined,
                            std::map<std::string, int>* failures) {
  absl::MutexLock l(&mu_);
  const bool done =
      mu_.AwaitWithDeadline(absl::Condition(this, &LightFleet::JoinedAllLocked), deadline);
  *joined = joined_;
  *failures = failures_;
  return done;
}

void LightFleet::Beat(int i) {
  Member& m = members_[i];
  if (m.crashed.load() || m.rank < 0) return;
  const absl::Duration timeout = std::max(options_.heartbeat, absl::Milliseconds(200));
  if (!BeatOnce(i, timeout)) failed_beats_.fetch_add(1, std::memory_order_relaxed);
}

void LightFleet::WorkerLoop(int thread) {
  std::vector<int> unjoined;
  for (int i = thread; i < options_.count; i += threads_started_) unjoined.push_back(i);
  std::reverse(unjoined.begin(), unjoined.end());  // joined from the back
  // (due, member): the earliest due on top.
  using Due = std::pair<absl::Time, int>;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> beats;
  for (;;) {
    const absl::Time now = absl::Now();
    if (!unjoined.empty() && (beats.empty() || beats.top().first > now)) {
      const int i = unjoined.back();
      unjoined.pop_back();
      const absl::Status s = JoinWithRetries(thread, i);
      absl::MutexLock l(&mu_);
      if (s.ok()) {
        ++joined_;
        beats.push({absl::Now() + options_.heartbeat, i});
      } else {
        ++gave_up_;
        ++failures_[std::string(s.message().substr(0, 200))];
      }
      continue;
    }
    if (beats.empty()) {
      SleepUntil(thread, absl::InfiniteFuture());
      return;
    }
    const auto [due, i] = beats.top();
    beats.pop();
    if (SleepUntil(thread, due)) return;
    const int64_t lag = absl::ToInt64Nanoseconds(absl::Now() - due);
    int64_t worst = worst_lag_ns_.load(std::memory_order_relaxed);
    while (lag > worst && !worst_lag_ns_.compare_exchange_weak(worst, lag)) {
    }
    Beat(i);
    beats.push({due + options_.heartbeat, i});
  }
}

void LightFleet::Start() {
  threads_started_ = std::max(1, std::min(options_.threads, options_.count));
  for (int t = 0; t < threads_started_; ++t) sleepers_.push_back(std::make_unique<Sleeper>());
  for (int t = 0; t < threads_started_; ++t) {
    threads_.emplace_back([this, t] { WorkerLoop(t); });
  }
}

void LightFleet::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_.store(true);
  }
  for (auto& s : sleepers_) {
    std::lock_guard<std::mutex> l(s->mu);  // a worker between its check and its wait sees it
    s->cv.notify_all();
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace hsdp::sim
