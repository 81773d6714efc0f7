#include "daemon/engine/cpu/cpu_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "hsdp/kernels/reduce_kernels.h"
#include "hsdp/common/logging.h"


namespace hsdp {
namespace {

// Elements per parallel chunk: large enough to amortise scheduling, small
// enough to balance two to a few dozen threads.
constexpr uint64_t kChunkBytes = 256 * 1024;

struct Range {
  uint64_t begin;
  uint64_t len;
};

// Splits elements [begin, end) of `es` bytes into ranges of about
// kChunkBytes, aligned to 64 elements (from `begin`).
std::vector<Range> SplitElements(uint64_t begin, uint64_t end, size_t es) {
  uint64_t per = std::max<uint64_t>(64, kChunkBytes / es / 64 * 64);
  std::vector<Range> out;
  for (uint64_t b = begin; b < end; b += per) out.push_back({b, std::min(per, end - b)});
  return out;
}

struct Copy {
  char* dst;
  const char* src;
  uint64_t bytes;
};

void RunCopies(const std::vector<Copy>& copies, cpu::ThreadPool* pool) {
  std::vector<Copy> pieces;
  for (const Copy& c : copies) {
    if (c.dst == c.src || c.bytes == 0) continue;
    for (uint64_t off = 0; off < c.bytes; off += kChunkBytes) {
      pieces.push_back({c.dst + off, c.src + off, std::min<uint64_t>(kChunkBytes, c.bytes - off)});
    }
  }
  auto body = [&](size_t i) { std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes); };
  if (pool != nullptr) {
    pool->ParallelFor(pieces.size(), body);
  } else {
    for (size_t i = 0; i < pieces.size(); ++i) body(i);
  }
}

void ForEach(size_t n, cpu::ThreadPool* pool, const std::function<void(size_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else {
    for (size_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace

constexpr size_t kMaxRememberedTickets = 4096;

void CpuEngine::Run(const EngineTask& t, cpu::ThreadPool* pool) {
  RunRange(t, pool, 0, t.count);
}

bool CpuEngine::Sliceable(const EngineTask& t) {
  switch (t.collective) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kBroadcast:
      return true;
    default:
      return false;
  }
}

void CpuEngine::RunRange(const EngineTask& t, cpu::ThreadPool* pool, uint64_t begin,
                         uint64_t end) {
  const int n = static_cast<int>(t.members.size());
  if (t.count == 0 && t.collective != Collective::kAllToAll) return;  // matched; nothing moves
  if (begin >= end && t.collective != Collective::kAllToAll) return;
  std::vector<const void*> send(n);
  std::vector<void*> recv(n);
  for (int r = 0; r < n; ++r) {
    send[r] = t.members[r].send.data;
    recv[r] = t.members[r].recv.data;
  }
  const size_t es = DataTypeSize(t.spec.dtype);
  switch (t.collective) {
    case Collective::kAllReduce: {
      const std::vector<Range> ranges = SplitElements(begin, end, es);
      ForEach(ranges.size(), pool, [&](size_t i) {
        const uint64_t off = ranges[i].begin * es;
        const void* in[64];
        void* out[64];
        std::vector<const void*> in_big;
        std::vector<void*> out_big;
        const void** ins = in;
        void** outs = out;
        if (n > 64) {
          in_big.resize(n);
          out_big.resize(n);
          ins = in_big.data();
          outs = out_big.data();
        }
        for (int r = 0; r < n; ++r) {
          ins[r] = static_cast<const char*>(send[r]) + off;
          outs[r] = static_cast<char*>(recv[r]) + off;
        }
        cpu::Reduce(t.spec, ins, n, outs, n, ranges[i].len);
      });
      break;
    }
    case Collective::kReduceScatter: {
      const std::vector<Range> ranges = SplitElements(begin, end, es);
      const size_t per_rank = ranges.size();
      ForEach(per_rank * n, pool, [&](size_t i) {
        const int r = static_cast<int>(i / per_rank);
        const Range& range = ranges[i % per_rank];
        const uint64_t in_off = (uint64_t(r) * t.count + range.begin) * es;
        std::vector<const void*> ins(n);
        for (int j = 0; j < n; ++j) ins[j] = static_cast<const char*>(send[j]) + in_off;
        void* out = static_cast<char*>(recv[r]) + range.begin * es;
        cpu::Reduce(t.spec, ins.data(), n, &out, 1, range.len);
      });
      break;
    }
    case Collective::kAllGather: {
      const uint64_t bytes = t.count * es;
      const uint64_t from = begin * es, len = (end - begin) * es;
      std::vector<Copy> copies;
      for (int r = 0; r < n; ++r) {
        for (int j = 0; j < n; ++j) {
          copies.push_back({static_cast<char*>(recv[r]) + uint64_t(j) * bytes + from,
                            static_cast<const char*>(send[j]) + from, len});
        }
      }
      RunCopies(copies, pool);
      break;
    }
    case Collective::kAllToAll: {
      if (begin != 0) return;  // not sliceable: runs whole at begin 0
      // Block j of member i goes to member j's slot i. Uneven blocks: offsets
      // are prefix sums of each member's counts (validated to fit).
      std::vector<Copy> copies;
      std::vector<std::vector<uint64_t>> recv_at(n, std::vector<uint64_t>(n, 0));
      for (int j = 0; j < n; ++j) {
        uint64_t off = 0;
        for (int i = 0; i < n; ++i) {
          recv_at[j][i] = off;
          off += t.members[j].recv_counts.empty() ? t.count : t.members[j].recv_counts[i];
        }
      }
      for (int i = 0; i < n; ++i) {
        uint64_t send_off = 0;
        for (int j = 0; j < n; ++j) {
          const uint64_t c =
              t.members[i].send_counts.empty() ? t.count : t.members[i].send_counts[j];
          copies.push_back({static_cast<char*>(recv[j]) + recv_at[j][i] * es,
                            static_cast<const char*>(send[i]) + send_off * es, c * es});
          send_off += c;
        }
      }
      RunCopies(copies, pool);
      break;
    }
    case Collective::kBroadcast: {
      std::vector<Copy> copies;
      for (int r = 0; r < n; ++r) {
        copies.push_back({static_cast<char*>(recv[r]) + begin * es,
                          static_cast<const char*>(send[t.root]) + begin * es,
                          (end - begin) * es});
      }
      RunCopies(copies, pool);
      break;
    }
    default:
      break;  // barrier: the match itself is the barrier
  }
}

namespace {

bool IdleAllowed(bool wanted) {
  if (!wanted) return false;
  static const bool can = cpu::ThreadPool::CanLeaveIdle();
  if (!can) {
    HSDP_LOG(Warning) << "engine: lower classes cannot yield the CPU to higher ones (SCHED_IDLE "
                         "could not be left again: run hsdpd as root or with CAP_SYS_NICE)";
  }
  return can;
}

int ClassIndex(int qos_class) {
  return std::clamp(qos_class, 0, CpuEngine::kClassLevels - 1);
}

}  // namespace

CpuEngine::CpuEngine(int threads, uint64_t inline_max_bytes, uint64_t slice_bytes, int bulk_nice,
                     bool idle_lower_classes, const Clock* clock)
    : clock_(clock != nullptr ? clock : Clock::Real()),
      inline_max_bytes_(inline_max_bytes),
      slice_bytes_(std::max<uint64_t>(slice_bytes, 64 * 1024)),
      idle_lower_classes_(IdleAllowed(idle_lower_classes)),
      pool_(std::max(1, threads), "hsdp-pool", bulk_nice) {
  executor_ = std::thread([this, bulk_nice] {
    cpu::ThreadPool::NameAndNice("hsdp-engine", bulk_nice);
    ExecutorLoop();
  });
}

bool CpuEngine::BetterClassActive(int qos_class, int64_t now, int64_t window_ns) const {
  for (int level = 0; level < ClassIndex(qos_class); ++level) {
    const int64_t t = class_active_ns_[level].load(std::memory_order_relaxed);
    if (t != 0 && now - t < window_ns) return true;
  }
  return false;
}

CpuEngine::~CpuEngine() { Shutdown(); }

uint64_t CpuEngine::Launch(EngineTask task, EngineCallbacks cb) {
  // No lock on the inline path: the dispatcher never waits for the executor.
  const uint64_t ticket = next_ticket_.fetch_add(1, std::memory_order_relaxed);
  if (idle_lower_classes_) {
    class_active_ns_[ClassIndex(task.qos_class)].store(clock_->NowNanos(),
                                                       std::memory_order_relaxed);
  }
  if (!task.AllLocal() || !task.AllHost()) {
    cb.launched(ticket);
    cb.completed(absl::UnimplementedError(
                     !task.AllLocal()
                         ? "the cpu engine runs groups whose members are all on this node"
                         : "the cpu engine runs on host memory only"),
                 0);
    return ticket;
  }
  if (task.BytesPerRank() <= inline_max_bytes_) {
    Execute(ticket, task, cb, nullptr);
    return ticket;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stopping_) {
      queued_by_class_[ClassIndex(task.qos_class)].fetch_add(1, std::memory_order_relaxed);
      queue_.Push(cpu::FairQueue::Entry{task.qos_class, task.job, task.priority, ticket});
      queued_.emplace(ticket, Queued{std::make_shared<EngineTask>(std::move(task)),
                                     std::make_shared<EngineCallbacks>(std::move(cb))});
      cv_.notify_one();
      return ticket;
    }
  }
  cb.launched(ticket);
  cb.completed(absl::UnavailableError("hsdpd is shutting down"), 0);
  return ticket;
}

absl::Status CpuEngine::Precondition(const EngineTask& task, uint64_t ticket) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = aborted_.find(ticket); it != aborted_.end()) {
    absl::Status s = it->second;
    aborted_.erase(it);
    return s;
  }
  for (uint64_t dep : task.depends_on) {
    if (auto it = failed_.find(dep); it != failed_.end()) {
      return absl::Status(it->second.code(),
                          absl::StrCat("an operation this one depends on failed: ",
                                       it->second.message()));
    }
  }
  return absl::OkStatus();
}

void CpuEngine::Finish(uint64_t ticket, absl::Status status, uint64_t exec_ns,
                       const EngineCallbacks& cb) {
  if (!status.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    failed_[ticket] = status;  // before `launched`: a dependent may launch from it
    while (failed_.size() > kMaxRememberedTickets) failed_.erase(failed_.begin());
  }
  cb.launched(ticket);
  cb.completed(std::move(status), exec_ns);
}

void CpuEngine::Execute(uint64_t ticket, const EngineTask& task, const EngineCallbacks& cb,
                        cpu::ThreadPool* pool) {
  // Inline, just launched: nobody can have aborted it yet, so only a
  // dependency needs the lock.
  absl::Status status = task.depends_on.empty() ? absl::OkStatus() : Precondition(task, ticket);
  const int64_t start = clock_->NowNanos();
  if (status.ok()) Run(task, pool);
  Finish(ticket, std::move(status), static_cast<uint64_t>(clock_->NowNanos() - start), cb);
}

bool CpuEngine::RunSlice(uint64_t ticket, Queued& q) {
  const EngineTask& task = *q.task;
  // The first slice checks the dependencies and an abort that came while
  // queued; later ones only an abort that came while running.
  absl::Status status = absl::OkStatus();
  if (!q.started) {
    q.started = true;
    status = Precondition(task, ticket);
  } else {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = aborted_.find(ticket); it != aborted_.end()) {
      status = it->second;
      aborted_.erase(it);
    }
  }
  if (!status.ok()) {
    Finish(ticket, std::move(status), q.exec_ns, *q.callbacks);
    return true;
  }
  const size_t es = DataTypeSize(task.spec.dtype);
  const int64_t now = clock_->NowNanos();
  if (task.qos_class != last_served_.first || task.job != last_served_.second) {
    if (!last_served_.second.empty()) last_switch_ns_ = now;  // not the first task
    last_served_ = {task.qos_class, task.job};  // copied only on a switch
  }
  const bool shared = now - last_switch_ns_ < kSharedWindowNs && last_switch_ns_ != 0;
  const uint64_t slice =
      shared ? std::max<uint64_t>(64 * 1024, slice_bytes_ / kSharedSliceDivisor) : slice_bytes_;
  uint64_t end = task.count;
  if (Sliceable(task)) end = std::min(task.count, q.next + std::max<uint64_t>(1, slice / es));
  // Only the wait and the computation yield: no lock is held in them but
  // the pool's own, which only this task's threads take.
  const bool idle = idle_lower_classes_ && BetterClassActive(task.qos_class, now, kSharedWindowNs);
  if (idle) {
    cpu::ThreadPool::SetIdle(0, true);
    pool_.SetWorkersIdle(true);
    if (!AwaitQuietGap(task.qos_class, now)) {
      // A better class queued work meanwhile: it goes first, this slice
      // back into the queue.
      pool_.SetWorkersIdle(false);
      cpu::ThreadPool::SetIdle(0, false);
      return false;
    }
    idle_slices_.fetch_add(1, std::memory_order_relaxed);
  }
  slices_run_.fetch_add(1, std::memory_order_relaxed);
  const int64_t start = clock_->NowNanos();
  RunRange(task, &pool_, q.next, end);
  q.exec_ns += static_cast<uint64_t>(clock_->NowNanos() - start);
  if (idle) {
    pool_.SetWorkersIdle(false);
    cpu::ThreadPool::SetIdle(0, false);
  }
  const uint64_t done_bytes = (end - q.next) * es * std::max<size_t>(1, task.members.size());
  q.next = end;
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.Charge(task.qos_class, task.job, done_bytes);
  }
  if (q.next < task.count) return false;
  Finish(ticket, absl::OkStatus(), q.exec_ns, *q.callbacks);
  return true;
}

bool CpuEngine::AwaitQuietGap(int qos_class, int64_t now) {
  // A core left truly idle pulls a waiting thread over at once, where one
  // busy with SCHED_IDLE work does not: so wait for a gap in the better
  // class's launches first, but never longer than kMaxYieldNs.
  bool waited = false;
  const int64_t give_up = now + kMaxYieldNs;
  for (int64_t t = now; BetterClassActive(qos_class, t, kQuietGapNs) && t < give_up;
       t = clock_->NowNanos()) {
    for (int level = 0; level < ClassIndex(qos_class); ++level) {
      if (queued_by_class_[level].load(std::memory_order_relaxed) > 0) return false;
    }
    waited = true;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (waited) yield_waits_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CpuEngine::Abort(uint64_t ticket, const absl::Status& why) {
  // A running slice cannot be interrupted (it only touches memory this
  // process keeps mapped); a queued task, or the next slice of a running
  // one, is failed when the executor takes it.
  std::lock_guard<std::mutex> l(mu_);
  if (ticket == 0 || ticket >= next_ticket_.load(std::memory_order_relaxed)) return;
  aborted_[ticket] = why;
  while (aborted_.size() > kMaxRememberedTickets) aborted_.erase(aborted_.begin());
}

void CpuEngine::ExecutorLoop() {
  for (;;) {
    cpu::FairQueue::Entry e;
    Queued* q = nullptr;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      std::optional<cpu::FairQueue::Entry> next = queue_.Pop();
      if (!next) return;  // stopping and drained
      e = std::move(*next);
      queued_by_class_[ClassIndex(e.qos_class)].fetch_sub(1, std::memory_order_relaxed);
      q = &queued_.at(e.order);  // map nodes are stable; only this thread erases
    }
    if (RunSlice(e.order, *q)) {
      std::lock_guard<std::mutex> l(mu_);
      queued_.erase(e.order);
    } else {
      std::lock_guard<std::mutex> l(mu_);
      queued_by_class_[ClassIndex(e.qos_class)].fetch_add(1, std::memory_order_relaxed);
      queue_.Push(e);  // after the slice: other jobs' work goes first
    }
  }
}

void CpuEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && !executor_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (executor_.joinable()) executor_.join();
}

}  // namespace hsdp
