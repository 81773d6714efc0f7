// A group's small-operation arena against a hostile member, with real
// processes and real uids: the tenant (an unprivileged uid) owns the job and
// rewrites the arena's geometry words; the victim is root, joined to the
// tenant's job by naming its owner (a documented operator action). The
// victim must neither crash nor write outside the arena: its memory around
// the arena mapping is compared before and after, and its results checked.
// Also: memory hsdpd handed out (the arena, the session channel) goes when
// the group and session end, though the tenant kept the fds.
//
// The tenant is a real uid (setresuid in a forked child), so these tests
// need root; they skip, saying so, otherwise.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "hsdp/shm/arena.h"
#include "job_identity_util.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using testing::BecomeUser;
using testing::Child;
using testing::DaemonProcess;
using testing::NowMs;
using testing::TempDir;

constexpr uid_t kTenant = 60001;
// Elements of the large all-reduce: 1 MiB of floats, far more than an arena
// slot (64 KiB) and more than the whole arena (2 members x 8 slots).
constexpr uint64_t kLarge = 256 * 1024;

struct Mapping {
  uintptr_t lo = 0, hi = 0;
  std::string perms, name;
};

std::vector<Mapping> Maps() {
  std::vector<Mapping> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    unsigned long lo = 0, hi = 0;
    char perms[8] = {0};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    m.lo = lo;
    m.hi = hi;
    m.perms = perms;
    const size_t slash = line.find('/');
    const size_t memfd = line.find("memfd:");
    const size_t at = std::min(slash, memfd);
    if (at != std::string::npos) m.name = line.substr(at);
    out.push_back(m);
  }
  return out;
}

// Bytes of this process's memory in [lo, lo + n) that are mapped readable,
// in order (unmapped gaps skipped): what an overflow past the arena would hit.
std::string Snapshot(uintptr_t lo, size_t n) {
  std::string out;
  for (const Mapping& m : Maps()) {
    if (m.hi <= lo || m.lo >= lo + n || m.perms[0] != 'r') continue;
    const uintptr_t a = std::max(m.lo, lo), b = std::min(m.hi, lo + n);
    out.append(reinterpret_cast<const char*>(a), b - a);
  }
  return out;
}

// Waits (bounded) for `path` to exist.
bool WaitForFile(const std::string& path, int timeout_ms) {
  return testing::Eventually([&] { return ::access(path.c_str(), F_OK) == 0; }, timeout_ms, 2);
}

struct Member {
  std::unique_ptr<Client> client;
  Buffer send, recv;
  Group group;
};

// `before_group` runs after the buffers are mapped and before NewGroup maps
// the arena (the victim places its canary there: mappings go top-down, so
// the arena lands right below it).
absl::Status Join(Member* m, const std::string& socket, const std::string& job, int rank,
                  std::optional<uint32_t> owner, const std::function<void()>& before_group = {}) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.owner_uid = owner;
  o.rank = rank;
  o.world_size = 2;
  auto c = Client::Connect(o);
  if (!c.ok()) return c.status();
  m->client = std::move(*c);
  auto s = m->client->AllocateBuffer(kLarge * sizeof(float));
  if (!s.ok()) return s.status();
  m->send = *s;
  auto r = m->client->AllocateBuffer(kLarge * sizeof(float));
  if (!r.ok()) return r.status();
  m->recv = *r;
  if (before_group) before_group();
  auto g = m->client->NewGroup({0, 1});
  if (!g.ok()) return g.status();
  m->group = *g;
  return absl::OkStatus();
}

// Runs an all-reduce of `count` floats (rank r contributes r + 1 + i % 7 at
// element i) and checks every element; returns the op id (0: the arena).
absl::StatusOr<uint64_t> CheckedAllReduce(Member* m, uint64_t count) {
  auto* in = static_cast<float*>(m->send.data);
  for (uint64_t i = 0; i < count; ++i) in[i] = float(m->group.rank + 1 + i % 7);
  std::memset(m->recv.data, 0, count * sizeof(float));
  auto w = m->client->AllReduce(m->group, {m->send.id, 0}, {m->recv.id, 0}, count,
                                DataType::kFloat32);
  if (!w.ok()) return w.status();
  if (absl::Status s = w->Wait(absl::Seconds(30)); !s.ok()) return s;
  const auto* out = static_cast<const float*>(m->recv.data);
  for (uint64_t i = 0; i < count; ++i) {
    const float want = float(1 + i % 7) + float(2 + i % 7);
    if (out[i] != want) {
      return absl::DataLossError(absl::StrCat("element ", i, " is ", out[i], ", want ", want));
    }
  }
  return w->op_id();
}

std::string HostileConfig() {
  return "node:\n  socket_mode: 0666\n  allowed_uids: [0, 60001]\n"
         "timeouts:\n  collective_ms: 5000\n  shutdown_grace_ms: 200\n";
}

// The tenant rewrites the arena's geometry (slot_bytes, slots) but not its
// `broken` word, so the arena still looks healthy. A member that re-read the
// geometry would copy a 1 MiB input past the end of its mapping; the root
// victim instead runs the large operation through the daemon, gets the right
// result, and its memory around the arena is unchanged.
TEST(ArenaHostileTest, RewrittenGeometryCannotMakeARootMemberWritePastTheArena) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string signals = dir.File("signals");
  ASSERT_EQ(::mkdir(signals.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(signals.c_str(), 0777), 0);
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(HostileConfig())) << d.Log();
  const std::string job = "geometry";
  const std::string rewritten = signals + "/rewritten", victim_ready = signals + "/victim-ready";

  Child tenant([&](FILE* out) -> int {
    if (!BecomeUser(kTenant)) return 10;
    Member m;
    // Attach first (root joins only a job that exists), then the group.
    if (absl::Status s = Join(&m, d.socket(), job, 1, std::nullopt,
                              [&] { std::fprintf(out, "tenant attached\n"); });
        !s.ok()) {
      std::fprintf(out, "tenant join: %s\n", s.ToString().c_str());
      return 11;
    }
    auto first = CheckedAllReduce(&m, 8);
    std::fprintf(out, "tenant first: %s\n", first.status().ToString().c_str());
    if (!WaitForFile(victim_ready, 30000)) return 12;
    // Find the arena and rewrite its geometry words only.
    for (const Mapping& map : Maps()) {
      if (map.name.find("memfd:hsdp-arena") == std::string::npos) continue;
      auto* h = reinterpret_cast<shm::ArenaHeader*>(map.lo);
      h->slot_bytes = uint64_t{1} << 40;
      h->slots = 0;
      h->members = 64;
      h->total_bytes = ~uint64_t{0};
      std::fprintf(out, "rewrote the geometry\n");
    }
    testing::WriteFile(rewritten, "");
    // Its own library is not what is under test; it submits the same
    // operation so that the victim's can complete.
    auto large = CheckedAllReduce(&m, kLarge);
    std::fprintf(out, "tenant large: %s\n", large.status().ToString().c_str());
    return 0;
  });
  ASSERT_TRUE(tenant.WaitFor("tenant attached", 30000)) << tenant.output() << d.Log();

  Child victim([&](FILE* out) -> int {
    // 1 MiB that nothing ever writes, mapped just before the arena (below
    // 2 MiB, so the kernel does not align it for huge pages elsewhere).
    constexpr size_t kCanary = 1u << 20;
    unsigned char* canary = nullptr;
    auto place_canary = [&] {
      void* p = ::mmap(nullptr, kCanary, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return;
      canary = static_cast<unsigned char*>(p);
      std::memset(canary, 0x5A, kCanary);
    };
    Member m;
    if (absl::Status s = Join(&m, d.socket(), job, 0, kTenant, place_canary); !s.ok()) {
      std::fprintf(out, "victim join: %s\n", s.ToString().c_str());
      return 20;
    }
    auto first = CheckedAllReduce(&m, 8);
    if (!first.ok() || *first != 0) {
      std::fprintf(out, "victim first: %s (op %lu; want the arena, op 0)\n",
                   first.status().ToString().c_str(),
                   static_cast<unsigned long>(first.ok() ? *first : 0));
      return 21;
    }
    Mapping arena;
    for (const Mapping& map : Maps()) {
      if (map.name.find("memfd:hsdp-arena") != std::string::npos) arena = map;
    }
    if (arena.lo == 0 || canary == nullptr) return 22;
    // What an overflow past the arena would hit first: the canary (the
    // usual layout), or a guard page (it would fault), or something else,
    // compared as a whole.
    Mapping next;
    for (const Mapping& map : Maps()) {
      if (map.lo == arena.hi) next = map;
    }
    const bool canary_next = reinterpret_cast<uintptr_t>(canary) == arena.hi;
    const bool guard_next = !canary_next && next.lo != 0 && next.perms[0] == '-';
    if (!canary_next && !guard_next) {
      std::fprintf(out, "after the arena: %lx-%lx %s %s\n", (unsigned long)next.lo,
                   (unsigned long)next.hi, next.perms.c_str(), next.name.c_str());
      if (next.name.find("memfd:hsdp") != std::string::npos) return 25;  // changes legitimately
    }
    const std::string after = Snapshot(arena.hi, std::min<size_t>(kCanary, next.hi - next.lo));
    const std::string before = Snapshot(arena.lo - 4096, 4096);
    auto canary_intact = [&] {
      for (size_t i = 0; i < kCanary; ++i) {
        if (canary[i] != 0x5A) return false;
      }
      return true;
    };
    std::fprintf(out, "after the arena: %s\n",
                 canary_next ? "the canary" : guard_next ? "a guard page" : "another mapping");
    testing::WriteFile(victim_ready, "");
    if (!WaitForFile(rewritten, 30000)) return 23;
    auto large = CheckedAllReduce(&m, kLarge);
    std::fprintf(out, "victim large: %s op %lu\n", large.status().ToString().c_str(),
                 static_cast<unsigned long>(large.ok() ? *large : 0));
    const bool intact = canary_intact() &&
                        Snapshot(arena.hi, std::min<size_t>(kCanary, next.hi - next.lo)) == after &&
                        Snapshot(arena.lo - 4096, 4096) == before;
    std::fprintf(out, "victim memory around the arena: %s (%zu bytes after it compared)\n",
                 intact ? "unchanged" : "CHANGED", after.size());
    // And the next small operation still runs, correctly, somewhere.
    auto small = CheckedAllReduce(&m, 8);
    std::fprintf(out, "victim small after: %s\n", small.status().ToString().c_str());
    return intact ? 0 : 24;
  });

  const int victim_rc = victim.Finish(60000);
  const int tenant_rc = tenant.Finish(60000);
  std::printf("--- victim\n%s--- tenant\n%s", victim.output().c_str(), tenant.output().c_str());
  EXPECT_EQ(victim_rc, 0) << victim.output() << tenant.output() << d.Log();
  EXPECT_THAT(victim.output(), HasSubstr("memory around the arena: unchanged")) << victim.output();
  // The large operation never ran in the arena (op id 0): it went to the
  // daemon, with the right result.
  EXPECT_THAT(victim.output(), HasSubstr("victim large: OK op ")) << victim.output();
  EXPECT_THAT(victim.output(), ::testing::Not(HasSubstr("victim large: OK op 0\n")))
      << victim.output();
  EXPECT_THAT(tenant.output(), HasSubstr("rewrote the geometry")) << tenant.output();
  (void)tenant_rc;  // the tenant may fail its own operations however it likes
  EXPECT_TRUE(d.Alive()) << d.Log();
}

// Blocks the OS counts for every memfd this process holds whose name has
// `name` (through /proc/self/fd), and how many there are.
std::pair<uint64_t, int> HeldBlocks(const std::vector<int>& fds) {
  uint64_t blocks = 0;
  for (int fd : fds) {
    struct stat st;
    if (::fstat(fd, &st) == 0) blocks += static_cast<uint64_t>(st.st_blocks);
  }
  return {blocks, static_cast<int>(fds.size())};
}

// Duplicates (to numbers >= kKeptFds, never scanned) every fd below
// kKeptFds whose target is the memfd `name`.
constexpr int kKeptFds = 2048;
std::vector<int> DupMemfds(const std::string& name) {
  std::vector<int> out;
  for (int fd = 0; fd < kKeptFds; ++fd) {
    char link[256] = {0};
    const std::string path = absl::StrCat("/proc/self/fd/", fd);
    const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
    if (n <= 0 || std::string(link, n).find("memfd:" + name) == std::string::npos) continue;
    out.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, kKeptFds));
  }
  return out;
}

// A tenant keeps the fds of every arena and session channel hsdpd handed it
// across 24 short jobs, against an arena budget of 4 MiB: once each job
// ended, none of that memory is still allocated (the OS's block counts of
// the kept files are zero), and its later jobs still get arenas.
TEST(ArenaHostileTest, MemoryTheDaemonHandedOutGoesWithTheGroupThoughTheFdsAreKept) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(HostileConfig() + "data_plane:\n  small_op_arena_mib: 4\n")) << d.Log();
  Child tenant([&](FILE* out) -> int {
    if (!BecomeUser(kTenant)) return 10;
    std::vector<int> arenas, channels;
    int with_arena = 0;
    for (int i = 0; i < 24; ++i) {
      ClientOptions o;
      o.socket_path = d.socket();
      o.job_id = absl::StrCat("pin-", i);
      o.world_size = 1;
      auto c = Client::Connect(o);
      if (!c.ok()) {
        std::fprintf(out, "connect %d: %s\n", i, c.status().ToString().c_str());
        return 11;
      }
      auto buf = (*c)->AllocateBuffer(4096);
      auto g = buf.ok() ? (*c)->NewGroup({0}) : absl::StatusOr<Group>(buf.status());
      if (!g.ok()) return 12;
      auto w = (*c)->AllReduce(*g, {buf->id, 0}, {buf->id, 0}, 8, DataType::kFloat32);
      if (!w.ok() || !w->Wait(absl::Seconds(30)).ok()) return 13;
      if (w->op_id() == 0) ++with_arena;
      for (int fd : DupMemfds("hsdp-arena")) arenas.push_back(fd);
      c->reset();  // detaches: the session, its job and its group end
    }
    // The library keeps no channel fd (only its mapping); a raw client keeps
    // the one hsdpd sent, then hangs up (the session ends).
    for (int i = 0; i < 24; ++i) {
      testing::RawSession raw;
      if (absl::Status s = raw.Open(d.socket(), absl::StrCat("raw-", i), 0, 1); !s.ok()) {
        std::fprintf(out, "raw attach %d: %s\n", i, s.ToString().c_str());
        return 14;
      }
      channels.push_back(::fcntl(raw.channel_fd(), F_DUPFD_CLOEXEC, kKeptFds));
    }
    // The daemon releases them as each session ends; wait (bounded) for the
    // last one.
    (void)testing::Eventually(
        [&] { return HeldBlocks(arenas).first == 0 && HeldBlocks(channels).first == 0; }, 20000,
        10);
    std::fprintf(out, "jobs with an arena: %d of 24\n", with_arena);
    std::fprintf(out, "kept %d arena fds holding %lu blocks, %d channel fds holding %lu blocks\n",
                 HeldBlocks(arenas).second, static_cast<unsigned long>(HeldBlocks(arenas).first),
                 HeldBlocks(channels).second,
                 static_cast<unsigned long>(HeldBlocks(channels).first));
    return 0;
  });
  ASSERT_EQ(tenant.Finish(120000), 0) << tenant.output() << d.Log();
  EXPECT_THAT(tenant.output(), HasSubstr("jobs with an arena: 24 of 24")) << tenant.output();
  EXPECT_THAT(tenant.output(), HasSubstr("kept 24 arena fds holding 0 blocks, 24 channel fds "
                                         "holding 0 blocks"))
      << tenant.output();
  EXPECT_TRUE(d.Alive()) << d.Log();
}

}  // namespace
}  // namespace hsdp
