// The order in which a queueing engine runs the work of several jobs: a job's
// share of the engine does not depend on how much it submits, and a higher
// class goes first.
//
// - Classes: a lower `qos_class` value is served first, whenever it has work
//   (a strict priority between classes).
// - Jobs within a class: start-time fair queueing on bytes. Each job has a
//   virtual time that grows by the bytes it was served; the job with the
//   smallest one goes next. A job that becomes busy starts at the virtual
//   time of the work being served, so idling earns no credit, and a busy
//   job never waits more than one slice per other busy job of its class.
// - Within a job: a lower op `priority` first (all-gather and
//   reduce-scatter before all-reduce), then arrival order.
//
// Work is served in slices (the engine charges each slice it runs with
// Charge), so a large operation is put back after each slice and a small
// one of another job or class runs in between.
//
// Not thread-safe: the engine holds its lock around every call.
#ifndef HSDP_DAEMON_ENGINE_CPU_FAIR_QUEUE_H_
#define HSDP_DAEMON_ENGINE_CPU_FAIR_QUEUE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hsdp::cpu {

class FairQueue {
 public:
  struct Entry {
    int qos_class = 1;
    std::string job;
    int priority = 1;
    uint64_t order = 0;  // arrival order, unique per entry (the engine's ticket)
  };

  // Queues `e` (a new entry, or one put back after a slice).
  void Push(const Entry& e);
  // The next entry to serve, removed from the queue; nullopt when empty.
  std::optional<Entry> Pop();
  // Adds `bytes` served to the job's virtual time (after each slice, before
  // putting the entry back).
  void Charge(int qos_class, const std::string& job, uint64_t bytes);

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Jobs with state kept (busy, or idle with credit still ahead of their
  // class's clock); bounded by the busy jobs plus kMaxIdleJobs.
  size_t jobs_tracked() const { return jobs_.size(); }
  static constexpr size_t kMaxIdleJobs = 256;

 private:
  using JobId = std::pair<int, std::string>;  // (qos_class, job)
  struct JobState {
    uint64_t vtime = 0;
    std::map<std::pair<int, uint64_t>, Entry> queued;  // (priority, order) -> entry
  };
  struct ClassState {
    // (vtime, job) of the busy jobs: the next one first.
    std::set<std::pair<uint64_t, std::string>> busy;
    uint64_t vclock = 0;  // the virtual time of the work served last
  };
  // Drops idle jobs whose virtual time is not ahead of their class's clock
  // (they would restart at the clock anyway).
  void ForgetIdle();

  std::map<int, ClassState> classes_;  // by qos_class, lowest first
  std::map<JobId, JobState> jobs_;
  size_t size_ = 0;
};

}  // namespace hsdp::cpu

#endif  // HSDP_DAEMON_ENGINE_CPU_FAIR_QUEUE_H_
