#include "daemon/device/fake_device_api.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/device/fake_device_arena.h"
#include "daemon/device/fake_shm.h"
#include "hsdp/kernels/reduce_kernels.h"
#include "hsdp/common/status_macros.h"

namespace hsdp::device {
namespace {

constexpr uint64_t kEventMagic = 0x5645454B414646ull;  // "FFAKEEV"

}  // namespace

struct FakeDeviceApi::Event {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    // Generation of the latest record and the one the stream reached: in
    // `own`, or — cross-process mode, interprocess events — in a shared
    // block another process records and waits on too.
    fakeshm::EventBlock own{};
    std::atomic<uint64_t>* recorded = &own.recorded;
    std::atomic<uint64_t>* completed = &own.completed;
    std::shared_ptr<fakeshm::SharedEvent> shared;  // keeps the block mapped
    absl::Status error;  // of the work the latest completed record captured
  };
  int device;
  bool interprocess;
  EventHandle origin;  // the creating handle (imports name it)
  std::shared_ptr<State> state;
};

struct FakeDeviceApi::Stream {
  int device;
  StreamPriority priority;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<absl::Status()>> queue;
  uint64_t enqueued = 0;
  uint64_t done = 0;
  bool stopping = false;
  std::atomic<bool> cancel{false};  // set by DestroyStream: pending waits give up
  absl::Status error;  // since the last event record; guarded by mu
  std::thread thread;

  void Run() {
    for (;;) {
      std::function<absl::Status()> fn;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        fn = std::move(queue.front());
        queue.pop_front();
      }
      absl::Status s = fn();
      std::lock_guard<std::mutex> l(mu);
      if (!s.ok() && error.ok()) error = s;
      ++done;
      cv.notify_all();
    }
  }
  void Push(std::function<absl::Status()> fn) {
    std::lock_guard<std::mutex> l(mu);
    queue.push_back(std::move(fn));
    ++enqueued;
    cv.notify_all();
  }
};

FakeDeviceApi::FakeDeviceApi(int devices, uint64_t arena_bytes, bool cross_process)
    : cross_process_(cross_process) {
  for (int d = 0; d < devices; ++d) arenas_.push_back(std::make_unique<Arena>(arena_bytes));
}

FakeDeviceApi::~FakeDeviceApi() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [h, s] : streams_) streams.push_back(std::move(s));
    streams_.clear();
    for (auto& s : destroyed_) streams.push_back(std::move(s));
    destroyed_.clear();
  }
  // The context goes away: waits that never fired are abandoned (the work
  // behind them is dropped with the process, as a driver would).
  for (auto& s : streams) {
    s->cancel = true;
    {
      std::lock_guard<std::mutex> l(s->mu);
      s->stopping = true;
      s->cv.notify_all();
    }
    s->thread.join();
  }
}

absl::StatusOr<StreamHandle> FakeDeviceApi::CreateStream(int device, StreamPriority priority) {
  if (device < 0 || device >= DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
  }
  auto s = std::make_shared<Stream>();
  s->device = device;
  s->priority = priority;
  s->thread = std::thread([raw = s.get()] { raw->Run(); });
  std::lock_guard<std::mutex> l(mu_);
  const StreamHandle h = next_handle_++;
  streams_[h] = std::move(s);
  return h;
}

void FakeDeviceApi::DestroyStream(StreamHandle stream) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return;
    s = std::move(it->second);
    streams_.erase(it);
  }
  // As cudaStreamDestroy: returns at once; queued work still runs, when the
  // events it waits on fire (possibly long after), then the thread ends.
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->stopping = true;
    s->cv.notify_all();
  }
  std::lock_guard<std::mutex> l(mu_);
  destroyed_.push_back(std::move(s));
}

std::shared_ptr<FakeDeviceApi::Stream> FakeDeviceApi::FindStream(StreamHandle h) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = streams_.find(h);
  return it == streams_.end() ? nullptr : it->second;
}

std::shared_ptr<FakeDeviceApi::Event> FakeDeviceApi::FindEvent(EventHandle h) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = events_.find(h);
  return it == events_.end() ? nullptr : it->second;
}

absl::StatusOr<EventHandle> FakeDeviceApi::CreateEvent(int device, bool interprocess) {
  if (device < 0 || device >= DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
  }
  auto state = std::make_shared<Event::State>();
  if (cross_process_ && interprocess) {
    absl::StatusOr<std::unique_ptr<fakeshm::SharedEvent>> shared = fakeshm::SharedEvent::Create();
    if (!shared.ok()) return shared.status();
    state->shared = *std::move(shared);
    state->recorded = &state->shared->block()->recorded;
    state->completed = &state->shared->block()->completed;
  }
  std::lock_guard<std::mutex> l(mu_);
  const EventHandle h = next_handle_++;
  events_[h] = std::make_shared<Event>(Event{device, interprocess, h, std::move(state)});
  return h;
}

void FakeDeviceApi::DestroyEvent(EventHandle event) {
  std::lock_guard<std::mutex> l(mu_);
  events_.erase(event);
}

absl::StatusOr<IpcHandleBytes> FakeDeviceApi::ExportEvent(EventHandle event) {
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr) return absl::NotFoundError("export of an unknown event");
  if (!e->interprocess) return absl::InvalidArgumentError("event is not interprocess");
  if (e->state->shared != nullptr) return e->state->shared->handle();
  IpcHandleBytes out{};
  const uint64_t fields[3] = {kEventMagic, e->origin, static_cast<uint64_t>(e->device)};
  std::memcpy(out.data(), fields, sizeof(fields));
  return out;
}

absl::StatusOr<EventHandle> FakeDeviceApi::ImportEvent(int device, const IpcHandleBytes& handle) {
  if (cross_process_) {
    if (device < 0 || device >= DeviceCount()) {
      return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
    }
    absl::StatusOr<std::unique_ptr<fakeshm::SharedEvent>> shared = fakeshm::SharedEvent::Open(handle);
    if (!shared.ok()) return shared.status();
    auto state = std::make_shared<Event::State>();
    state->shared = *std::move(shared);
    state->recorded = &state->shared->block()->recorded;
    state->completed = &state->shared->block()->completed;
    std::lock_guard<std::mutex> l(mu_);
    const EventHandle h = next_handle_++;
    events_[h] = std::make_shared<Event>(Event{device, true, h, std::move(state)});
    return h;
  }
  uint64_t fields[3];
  std::memcpy(fields, handle.data(), sizeof(fields));
  if (fields[0] != kEventMagic) return absl::InvalidArgumentError("not a fake event handle");
  std::lock_guard<std::mutex> l(mu_);
  auto it = events_.find(fields[1]);
  if (it == events_.end() || !it->second->interprocess) {
    return absl::InvalidArgumentError("event handle names no live interprocess event");
  }
  if (it->second->device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("event is on device ", it->second->device, ", not ", device));
  }
  const EventHandle h = next_handle_++;
  events_[h] = std::make_shared<Event>(Event{device, true, fields[1], it->second->state});
  return h;
}

absl::Status FakeDeviceApi::RecordEvent(EventHandle event, StreamHandle stream) {
  std::shared_ptr<Event> e = FindEvent(event);
  std::shared_ptr<Stream> s = FindStream(stream);
  if (e == nullptr || s == nullptr) return absl::NotFoundError("record: unknown event or stream");
  if (e->device != s->device) {
    return absl::InvalidArgumentError("record: event and stream are on different devices");
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> l(e->state->mu);
    gen = e->state->recorded->fetch_add(1) + 1;
  }
  s->Push([st = e->state, gen, raw = s.get()]() {
    absl::Status err;
    {
      std::lock_guard<std::mutex> l(raw->mu);
      err = std::exchange(raw->error, absl::OkStatus());
    }
    std::lock_guard<std::mutex> l(st->mu);
    uint64_t seen = st->completed->load();
    while (seen < gen && !st->completed->compare_exchange_weak(seen, gen)) {
    }
    st->error = err;
    st->cv.notify_all();
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::StreamWaitEvent(StreamHandle stream, EventHandle event) {
  std::shared_ptr<Event> e = FindEvent(event);
  std::shared_ptr<Stream> s = FindStream(stream);
  if (e == nullptr || s == nullptr) return absl::NotFoundError("wait: unknown event or stream");
  uint64_t target;
  {
    std::lock_guard<std::mutex> l(e->state->mu);
    target = e->state->recorded->load();
  }
  s->Push([st = e->state, target, raw = s.get()]() {
    std::unique_lock<std::mutex> l(st->mu);
    while (st->completed->load() < target) {
      if (raw->cancel) return absl::CancelledError("stream destroyed while waiting on an event");
      st->cv.wait_for(l, std::chrono::milliseconds(5));
    }
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeDeviceApi::EventDone(EventHandle event) {
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr) return absl::NotFoundError("query of an unknown event");
  {
    std::lock_guard<std::mutex> l(mu_);
    if (faults_ > 0) {
      return absl::InternalError(
          absl::StrCat("fake device: illegal address (sticky): ", first_fault_));
    }
  }
  std::lock_guard<std::mutex> l(e->state->mu);
  if (e->state->completed->load() < e->state->recorded->load()) return false;
  if (!e->state->error.ok()) return e->state->error;
  return true;
}

bool FakeDeviceApi::InArena(DevicePtr ptr, uint64_t bytes) const {
  if (cross_process_) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = foreign_.upper_bound(ptr);
    if (it != foreign_.begin()) {
      --it;
      if (bytes <= it->second && ptr - it->first <= it->second - bytes) return true;
    }
  }
  for (const auto& a : arenas_) {
    const uint64_t lo = reinterpret_cast<uintptr_t>(a->mem);
    if (ptr >= lo && bytes <= a->size && ptr - lo <= a->size - bytes) return true;
  }
  return false;
}

int FakeDeviceApi::draining_streams() const {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> l(mu_);
    streams = destroyed_;
  }
  int n = 0;
  for (const auto& s : streams) {
    std::lock_guard<std::mutex> l(s->mu);
    n += s->done < s->enqueued ? 1 : 0;
  }
  return n;
}

absl::Status FakeDeviceApi::CopyToDevice(DevicePtr dst, const void* src, uint64_t bytes) {
  if (!InArena(dst, bytes)) return absl::InvalidArgumentError("copy: range outside every device");
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::CopyToHost(void* dst, DevicePtr src, uint64_t bytes) {
  if (!InArena(src, bytes)) return absl::InvalidArgumentError("copy: range outside every device");
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::EnqueueHostFn(StreamHandle stream, std::function<absl::Status()> fn) {
  std::shared_ptr<Stream> s = FindStream(stream);
  if (s == nullptr) return absl::NotFoundError("unknown stream");
  s->Push(std::move(fn));
  return absl::OkStatus();
}

void FakeDeviceApi::SyncStream(StreamHandle stream) {
  std::shared_ptr<Stream> s = FindStream(stream);
  if (s == nullptr) return;
  std::unique_lock<std::mutex> l(s->mu);
  const uint64_t target = s->enqueued;
  s->cv.wait(l, [&] { return s->done >= target || s->stopping; });
}

absl::StatusOr<StreamPriority> FakeDeviceApi::PriorityOf(StreamHandle stream) const {
  std::shared_ptr<Stream> s = FindStream(stream);
  if (s == nullptr) return absl::NotFoundError("unknown stream");
  return s->priority;
}

absl::StatusOr<int> FakeDeviceApi::DeviceOf(StreamHandle stream) const {
  std::shared_ptr<Stream> s = FindStream(stream);
  if (s == nullptr) return absl::NotFoundError("unknown stream");
  return s->device;
}

int FakeDeviceApi::live_mappings() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(mappings_.size());
}
int FakeDeviceApi::imports() const {
  std::lock_guard<std::mutex> l(mu_);
  return imports_;
}
int FakeDeviceApi::live_allocations() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(allocations_.size());
}
int FakeDeviceApi::live_streams() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(streams_.size());
}
int FakeDeviceApi::live_events() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(events_.size());
}

}  // namespace hsdp::device
