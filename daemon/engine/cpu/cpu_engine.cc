#include "daemon/engine/cpu/cpu_engine.h"

#include <algorithm>
#include <cstring>

#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

// Elements per parallel chunk: large enough to amortise scheduling, small
// enough to balance two to a few dozen threads.
constexpr uint64_t kChunkBytes = 256 * 1024;

struct Range {
  uint64_t begin;
  uint64_t len;
};

// Splits `count` elements of `es` bytes into ranges of about kChunkBytes,
// aligned to 64 elements.
std::vector<Range> SplitElements(uint64_t count, size_t es) {
  uint64_t per = std::max<uint64_t>(64, kChunkBytes / es / 64 * 64);
  std::vector<Range> out;
  for (uint64_t b = 0; b < count; b += per) out.push_back({b, std::min(per, count - b)});
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

uint64_t EngineTask::BytesPerRank() const {
  uint64_t b = count * DataTypeSize(spec.dtype);
  if (collective == Collective::kAllGather || collective == Collective::kReduceScatter) {
    b *= send.size();
  }
  return b;
}

void CpuEngine::Run(const EngineTask& t, cpu::ThreadPool* pool) {
  const int n = static_cast<int>(t.send.size());
  const size_t es = DataTypeSize(t.spec.dtype);
  switch (t.collective) {
    case Collective::kAllReduce: {
      const std::vector<Range> ranges = SplitElements(t.count, es);
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
          ins[r] = static_cast<const char*>(t.send[r]) + off;
          outs[r] = static_cast<char*>(t.recv[r]) + off;
        }
        cpu::Reduce(t.spec, ins, n, outs, n, ranges[i].len);
      });
      break;
    }
    case Collective::kReduceScatter: {
      const std::vector<Range> ranges = SplitElements(t.count, es);
      const size_t per_rank = ranges.size();
      ForEach(per_rank * n, pool, [&](size_t i) {
        const int r = static_cast<int>(i / per_rank);
        const Range& range = ranges[i % per_rank];
        const uint64_t in_off = (uint64_t(r) * t.count + range.begin) * es;
        std::vector<const void*> ins(n);
        for (int j = 0; j < n; ++j) ins[j] = static_cast<const char*>(t.send[j]) + in_off;
        void* out = static_cast<char*>(t.recv[r]) + range.begin * es;
        cpu::Reduce(t.spec, ins.data(), n, &out, 1, range.len);
      });
      break;
    }
    case Collective::kAllGather: {
      const uint64_t bytes = t.count * es;
      std::vector<Copy> copies;
      for (int r = 0; r < n; ++r) {
        for (int j = 0; j < n; ++j) {
          copies.push_back({static_cast<char*>(t.recv[r]) + uint64_t(j) * bytes,
                            static_cast<const char*>(t.send[j]), bytes});
        }
      }
      RunCopies(copies, pool);
      break;
    }
    case Collective::kBroadcast: {
      std::vector<Copy> copies;
      for (int r = 0; r < n; ++r) {
        copies.push_back({static_cast<char*>(t.recv[r]),
                          static_cast<const char*>(t.send[t.root]), t.count * es});
      }
      RunCopies(copies, pool);
      break;
    }
    default:
      break;  // barrier: the match itself is the barrier
  }
}

CpuEngine::CpuEngine(int threads, uint64_t inline_max_bytes)
    : inline_max_bytes_(inline_max_bytes), pool_(std::max(1, threads)) {
  executor_ = std::thread([this] { ExecutorLoop(); });
}

CpuEngine::~CpuEngine() { Shutdown(); }

void CpuEngine::Submit(EngineTask task, DoneCallback done) {
  if (task.BytesPerRank() <= inline_max_bytes_) {
    const int64_t start = shm::NowNanos();
    Run(task, nullptr);
    done(absl::OkStatus(), static_cast<uint64_t>(shm::NowNanos() - start));
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stopping_) {
      queue_.push(Queued{task.priority, next_order_++, std::make_shared<EngineTask>(std::move(task)),
                         std::make_shared<DoneCallback>(std::move(done))});
      cv_.notify_one();
      return;
    }
  }
  done(absl::UnavailableError("hsdpd is shutting down"), 0);
}

void CpuEngine::ExecutorLoop() {
  for (;;) {
    Queued q;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      q = queue_.top();
      queue_.pop();
    }
    const int64_t start = shm::NowNanos();
    Run(*q.task, &pool_);
    (*q.done)(absl::OkStatus(), static_cast<uint64_t>(shm::NowNanos() - start));
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
