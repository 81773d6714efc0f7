// Fuzz target: the data plane behind the ring. Three trainers of one job
// (ranks 0..2, each with two registered buffers) and three groups ({0,1,2},
// {0,1}, {1,2}: ids 1, 2, 3) on a real SessionManager; the fuzzer writes
// descriptors into the trainers' rings (and scribbles on their head index)
// and the dispatcher's code pops, validates, matches and hands them to a
// fake stream-ordered engine, which the fuzzer completes, fails, aborts or
// really executes on the buffers. Trainers die, time passes.
//
// Records (fuzz_input.h), op % 7:
//   0 push  [session: u8][OpDescriptor: 192 bytes], then drain the rings
//   1 head  [session: u8][head: u64] written to the ring's head, then drain
//   2 engine [what: u8]: complete the oldest task OK / with an error /
//            execute it on the buffers / abort it
//   3 end   [session: u8]: the trainer is gone (its data connection closed)
//   4 time  [seconds: u8]: every group checks its timeouts that much later
//   5 housekeeping
//   6 rejoin [session: u8][group: u8]: NewGroup(rejoin_group_id)
//
// Oracles beyond "no crash, no sanitizer report": every local member of a
// task the engine receives has send and recv ranges inside its own session's
// registered buffers; at the end (every session ended, every task
// completed) each operation the dispatcher handled was completed exactly
// once, successfully or not: none is left hanging.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "daemon/dataplane/dispatcher.h"
#include "daemon/engine/fake/fake_engine.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/session/shm_channel.h"
#include "fuzz_input.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"

namespace hsdp::fuzz {
namespace {

constexpr int kRanks = 3;
constexpr uint64_t kBufBytes[] = {4096, 256};
const PeerCred kCred{1, 1000, 1000};

UniqueFd SealedMemfd(uint64_t bytes) {
  UniqueFd fd(::memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) Fail("memfd");
  ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  return fd;
}

struct Trainer {
  uint64_t id = 0;
  std::shared_ptr<Session> session;  // kept after it ends, for the counts
  std::vector<std::shared_ptr<MappedBuffer>> buffers;
  uint64_t handled = 0;
  bool ended = false;
};

class World {
 public:
  World() : sm_(Config(), Limits(), &engine_), dispatcher_(&sm_, Wake(), 0) {
    for (int r = 0; r < kRanks; ++r) {
      AttachParams p;
      p.job_id = "fuzz";
      p.rank = r;
      p.world_size = kRanks;
      p.protocol_version = shm::kLayoutVersion;
      p.features = shm::kFeaturesImplemented;
      auto a = sm_.Attach(p, kCred);
      if (!a.ok()) Fail(a.status().ToString());
      if (!sm_.ClaimSession(a->session_id, a->token.data(), kCred).ok()) Fail("claim");
      Trainer& t = trainers_[r];
      t.id = a->session_id;
      t.session = sm_.FindSession(t.id);
      for (uint64_t tag = 1; tag <= 2; ++tag) {
        t.session->PutFd(tag, SealedMemfd(kBufBytes[tag - 1]));
        auto b = sm_.RegisterBufferSync(t.id, tag, kBufBytes[tag - 1], "b", kCred);
        if (!b.ok() || *b != tag) Fail("register: " + b.status().ToString());
        t.buffers.push_back(t.session->FindBuffer(*b));
      }
    }
    const std::vector<std::vector<int>> groups = {{0, 1, 2}, {0, 1}, {1, 2}};
    for (const auto& ranks : groups) {
      for (int r : ranks) {
        auto g = sm_.NewGroup(trainers_[r].id, ranks, kCred);
        if (!g.ok()) Fail("NewGroup: " + g.status().ToString());
      }
    }
  }

  ~World() {
    sm_.EndAll("fuzz input over");
    for (int i = 0; i < 10000 && engine_.pending() > 0; ++i) engine_.Finish(absl::OkStatus());
    for (const Trainer& t : trainers_) {
      const uint64_t done = t.session->ops_completed() + t.session->ops_failed();
      HSDP_FUZZ_CHECK(done == t.handled,
                      absl::StrCat("session ", t.id, ": ", t.handled, " operations handled, ",
                                   done, " completed"));
    }
  }

  void Push(int r, const shm::OpDescriptor& d) {
    Trainer& t = trainers_[r];
    auto* h = static_cast<shm::ChannelHeader*>(t.session->channel().region().data());
    const uint64_t head = h->head.load();
    std::memcpy(&shm::RingSlots(h)[head & (h->ring_entries - 1)], &d, sizeof(d));
    h->head.store(head + 1);
  }
  void SetHead(int r, uint64_t head) {
    auto* h = static_cast<shm::ChannelHeader*>(trainers_[r].session->channel().region().data());
    h->head.store(head);
  }

  // What Dispatcher::DrainAll does for every live session.
  void Drain() {
    for (Trainer& t : trainers_) {
      if (t.ended || t.session->closed()) continue;
      shm::OpDescriptor d;
      for (int i = 0; i < 64; ++i) {
        const ShmChannel::PopResult res = t.session->channel().Pop(&d);
        if (res == ShmChannel::PopResult::kEmpty) break;
        if (res == ShmChannel::PopResult::kCorrupt) {
          End(t);
          break;
        }
        ++t.handled;
        dispatcher_.Handle(t.session, d);
      }
    }
  }

  void End(Trainer& t) {
    if (t.ended) return;
    t.ended = true;
    sm_.EndSession(t.id, "fuzz: trainer gone");
  }
  void End(int r) { End(trainers_[r]); }

  void Engine(uint8_t what) {
    if (engine_.pending() == 0) return;
    CheckFront();
    switch (what % 4) {
      case 0: engine_.Finish(absl::OkStatus()); break;
      case 1: engine_.Finish(absl::InternalError("fuzz: engine failed")); break;
      case 2: (void)engine_.Execute(); break;
      case 3: engine_.Abort(engine_.front_ticket(), absl::AbortedError("fuzz: aborted")); break;
    }
  }

  void Time(uint8_t seconds) {
    const int64_t later = shm::NowNanos() + int64_t{seconds} * 1'000'000'000;
    for (const auto& g : sm_.AllGroups()) g->CheckTimeouts(later);
  }
  void Housekeeping() { sm_.Housekeeping(); }
  void Rejoin(int r, uint32_t group) {
    if (trainers_[r].ended) return;
    (void)sm_.NewGroup(trainers_[r].id, {}, kCred, group);
  }

 private:
  static NodeConfig Config() {
    NodeConfig c;
    c.ring_entries = 16;
    c.collective_timeout_ms = 1000;
    return c;
  }
  static NodeLimits Limits() {
    NodeLimits l;
    l.max_node_bytes = 1 << 30;
    l.max_mappings = 1000;
    return l;
  }
  static const WakeFd* Wake() {
    static const WakeFd* wake = [] {
      auto w = WakeFd::Create();
      if (!w.ok()) Fail("WakeFd");
      return w->release();
    }();
    return wake;
  }

  // The oldest task's local members name ranges inside their own buffers.
  void CheckFront() {
    const EngineTask t = engine_.front();
    for (const EngineMember& m : t.members) {
      if (!m.local) continue;
      HSDP_FUZZ_CHECK(m.global_rank >= 0 && m.global_rank < kRanks, "member rank");
      const Trainer& tr = trainers_[m.global_rank];
      for (const BufferView* v : {&m.send, &m.recv}) {
        if (v->bytes == 0) continue;
        bool inside = false;
        const auto a = reinterpret_cast<uintptr_t>(v->data);
        for (const auto& b : tr.buffers) {
          const auto lo = reinterpret_cast<uintptr_t>(b->data());
          inside = inside || (a >= lo && a <= lo + b->size() && v->bytes <= lo + b->size() - a);
        }
        HSDP_FUZZ_CHECK(inside, absl::StrCat("rank ", m.global_rank, ": a range of ", v->bytes,
                                             " bytes outside its buffers"));
      }
    }
  }

  FakeStreamEngine engine_;
  SessionManager sm_;
  Dispatcher dispatcher_;
  Trainer trainers_[kRanks];
};

}  // namespace
}  // namespace hsdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsdp;
  using namespace hsdp::fuzz;
  World w;
  Script script(data, size);
  Record r;
  for (int ops = 0; script.Next(&r) && ops < 128; ++ops) {
    Fields f(r.payload);
    const uint8_t first = f.Get<uint8_t>();
    const int s = first % kRanks;
    switch (r.op % 7) {
      case 0:
        w.Push(s, f.Get<shm::OpDescriptor>());
        w.Drain();
        break;
      case 1:
        w.SetHead(s, f.Get<uint64_t>());
        w.Drain();
        break;
      case 2: w.Engine(first); break;
      case 3: w.End(s); break;
      case 4: w.Time(first); break;
      case 5: w.Housekeeping(); break;
      case 6: w.Rejoin(s, f.Get<uint8_t>()); break;
    }
  }
  return 0;
}
