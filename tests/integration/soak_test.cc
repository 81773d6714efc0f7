// The soak test (docs/security.md "Soak"): a 3-daemon cluster under churn
// and hostile input for a bounded time, while a verified job runs
// throughout; afterwards every daemon holds what it held before.
//
// - the verified job: rank 0 on node 0, rank 1 on node 1, all-reduce,
//   all-gather and reduce-scatter in a loop, every result checked against
//   an independent reference (collective_check.h); it must lose nothing:
//   every operation completes OK with the right values;
// - churn: pairs of trainers attach to random nodes (same node or two),
//   form a group, run checked all-reduces and detach, exit without
//   detaching, or are SIGKILLed at a random point;
// - hostile sessions: raw clients that register a buffer and write random
//   and mutated descriptors into their ring, sometimes an impossible head;
// - hostile callers (uid 65534 when the test runs as root): connections
//   that send garbage, gRPC calls with random fields and other sessions'
//   ids;
// - node 2 is SIGKILLed a third of the way in and restarted 5 s later.
//
// No process may hang (each has 60 s), no daemon may die but the one
// killed. Before the churn, a warm-up runs a pair on every pair of nodes
// (the transports and pools each node creates once), then each daemon is
// measured with only the verified job attached; the restarted node is
// measured again once it rejoined and warmed up. Afterwards, everything
// quiet again, each daemon must be back to its measure:
// - strictly: fd count, session and job tables, every thread except the
//   pools that grow on demand and never shrink (the cross-node engine's
//   workers, "hsdp-xworker", at most 64 x 4 threads; gRPC's executor and
//   sync-server workers), and every mapping of a file or memfd;
// - within stated slack: anonymous mappings (two per new pool thread, and
//   kAnonSlack for glibc's arenas and its cache of exited threads' stacks)
//   and RSS (kRssSlackKb; not compared under sanitizers).
// The figures are printed ("soak:" lines; docs/security.md has a run's).
//
// Duration: HSDP_SOAK_SECONDS (CMake cache, default 150; the environment
// variable of the same name overrides it for a longer run by hand).
#include <dirent.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster_fixture.h"
#include "raw_session.h"
#include "hsdp/v1/admin.grpc.pb.h"

#ifndef HSDP_SOAK_SECONDS
#define HSDP_SOAK_SECONDS 150
#endif

namespace hsdp::testing {
namespace {

constexpr int kNodes = 3;
constexpr int kVictim = 2;  // the node killed and restarted
constexpr uint32_t kNobody = 65534;
// The cross-node engine's worker pool (HierarchicalEngine::WorkerLoop names
// it; its sidecar and local pool inherit the name): up to 64 workers of up
// to 2 + engine.threads threads.
constexpr char kPoolThreads[] = "hsdp-xworker";
constexpr int kMaxPoolThreads = 64 * 4;
// gRPC's own pools, which it grows on demand and does not shrink: its
// executor (2 threads per core) and the synchronous server's workers (at
// most the 32 the daemon allows, daemon.cc).
constexpr const char* kGrpcPools[] = {"default-executo", "grpcpp_sync_ser"};
constexpr int kMaxGrpcPoolThreads = 2 * 64 + 32;
// Anonymous mappings that may appear without a leak beyond two per new pool
// thread: glibc's arenas (at most 8 per core) and its cache of stacks of
// exited threads.
constexpr int kAnonSlack = 24;
// RSS may grow this much and count as "back": glibc keeps freed memory in
// its arenas (measured figures are printed).
#ifdef HSDP_SANITIZED
constexpr long kRssSlackKb = -1;  // not compared: sanitizers keep freed memory on purpose
#else
constexpr long kRssSlackKb = 64 * 1024;
#endif

int SoakSeconds() {
  if (const char* s = std::getenv("HSDP_SOAK_SECONDS"); s != nullptr && std::atoi(s) > 0) {
    return std::atoi(s);
  }
  return HSDP_SOAK_SECONDS;
}

struct ProcStats {
  int fds = -1, threads = -1, maps = -1, sessions = -1, jobs = -1;
  // Cross-node groups of ended jobs whose engine state the daemon still keeps.
  int retired_groups = -1;
  long rss_kb = -1;
  // For the report when a count differs: thread names, fd targets and
  // mappings (size and name, without addresses).
  std::map<std::string, int> thread_names, fd_kinds, map_kinds;
  std::string ToString() const {
    return absl::StrCat("fds ", fds, ", threads ", threads, ", mappings ", maps, ", RSS ",
                        rss_kb / 1024, " MiB, sessions ", sessions, ", jobs ", jobs);
  }
};

int CountDir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (struct dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// "3 more / 1 fewer" lines for the keys whose counts differ.
std::string Diff(const std::map<std::string, int>& before, const std::map<std::string, int>& after) {
  std::string out;
  std::map<std::string, int> d = after;
  for (const auto& [k, n] : before) d[k] -= n;
  for (const auto& [k, n] : d) {
    if (n != 0) absl::StrAppend(&out, "    ", n > 0 ? "+" : "", n, " ", k, "\n");
  }
  return out;
}

// The mappings of a file or memfd (names starting with '/'), and how many
// anonymous ones there are.
std::map<std::string, int> Named(const std::map<std::string, int>& maps) {
  std::map<std::string, int> out;
  for (const auto& [k, n] : maps) {
    if (k.find(" /") != std::string::npos) out[k] = n;
  }
  return out;
}
int Anonymous(const std::map<std::string, int>& maps) {
  int n = 0;
  for (const auto& [k, c] : maps) n += k.find(" /") == std::string::npos ? c : 0;
  return n;
}

std::map<std::string, int> Histogram(const std::vector<std::string>& items) {
  std::map<std::string, int> h;
  for (const std::string& i : items) ++h[i];
  return h;
}

std::vector<std::string> DirNames(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

// What the sockets of `proc` are, by inode: "tcp LISTEN :port",
// "tcp 01 :local->:remote", "unix /path" (from /proc/PID/net).
std::map<std::string, std::string> Sockets(const std::string& proc) {
  std::map<std::string, std::string> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::istringstream in(ReadFile(proc + "/net/" + table));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      char local[128] = {0}, remote[128] = {0}, state[8] = {0};
      unsigned long inode = 0;
      if (std::sscanf(line.c_str(), "%*d: %127s %127s %7s %*s %*s %*s %*s %*s %lu", local, remote,
                      state, &inode) != 4) {
        continue;
      }
      auto port = [](const char* a) { return std::strtoul(std::strchr(a, ':') + 1, nullptr, 16); };
      out[std::to_string(inode)] = std::string(state) == "0A"
                                       ? absl::StrCat(table, " LISTEN :", port(local))
                                       : absl::StrCat(table, " state ", state, " :", port(local),
                                                      "->:", port(remote));
    }
  }
  std::istringstream in(ReadFile(proc + "/net/unix"));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    f >> num >> refs >> proto >> flags >> type >> st >> inode >> path;
    out[inode] = "unix " + (path.empty() ? std::string("(unnamed)") : path);
  }
  return out;
}

ProcStats Measure(pid_t pid, const std::string& socket) {
  ProcStats s;
  const std::string proc = absl::StrCat("/proc/", pid);
  s.fds = CountDir(proc + "/fd");
  const std::map<std::string, std::string> sockets = Sockets(proc);
  std::vector<std::string> names;
  for (const std::string& fd : DirNames(proc + "/fd")) {
    char target[256] = {0};
    (void)::readlink((proc + "/fd/" + fd).c_str(), target, sizeof(target) - 1);
    std::string t = target;
    if (t.rfind("socket:[", 0) == 0) {
      auto it = sockets.find(t.substr(8, t.size() - 9));
      t = it == sockets.end() ? "socket (not in /proc/net)" : "socket " + it->second;
    } else if (const size_t at = t.find(":["); at != std::string::npos) {
      t = t.substr(0, at);  // pipe:[123]
    }
    names.push_back(t);
  }
  s.fd_kinds = Histogram(names);
  names.clear();
  for (const std::string& task : DirNames(proc + "/task")) {
    std::string comm = ReadFile(proc + "/task/" + task + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    names.push_back(comm);
  }
  s.thread_names = Histogram(names);
  names.clear();
  {
    std::istringstream maps(ReadFile(proc + "/maps"));
    for (std::string line; std::getline(maps, line);) {
      unsigned long lo = 0, hi = 0;
      char perms[8] = {0};
      std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms);
      const size_t slash = line.find_first_of("/[");
      names.push_back(absl::StrCat(perms, " ", (hi - lo) / 1024, "K ",
                                   slash == std::string::npos ? "(anon)" : line.substr(slash)));
    }
  }
  s.map_kinds = Histogram(names);
  std::istringstream status(ReadFile(proc + "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atoi(line.c_str() + 8);
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::atol(line.c_str() + 6);
  }
  const std::string maps = ReadFile(proc + "/maps");
  s.maps = static_cast<int>(std::count(maps.begin(), maps.end(), '\n'));
  v1::StatusResponse st;
  if (QueryStatus(socket, &st)) {
    s.sessions = st.sessions_size();
    s.jobs = st.jobs_size();
    s.retired_groups = static_cast<int>(st.retired_groups());
  }
  return s;
}

// A child process of the churn (a Child), watched without blocking, killed
// at its kill time (on purpose) or at its deadline (hung). The churn is
// driven from the test's main thread only (forking from a process with
// several threads could leave a child stuck on a lock another thread held).
class Proc {
 public:
  Proc(std::string what, const Child::Body& body, int64_t deadline_ms, int64_t kill_at_ms)
      : what_(std::move(what)), child_(body), deadline_ms_(deadline_ms), kill_at_ms_(kill_at_ms) {}
  // Reads output, kills it at its kill time or deadline; true once it exited.
  bool Poll(int64_t now) {
    if (rc_ != kRunning) return true;
    child_.Drain();
    if (kill_at_ms_ > 0 && now >= kill_at_ms_) {
      child_.Kill();
      killed_ = true;
      kill_at_ms_ = 0;
    }
    if (now >= deadline_ms_ && !hung_) {
      hung_ = true;
      child_.Kill();
    }
    const int rc = child_.TryReap();
    if (rc < 0) return false;
    child_.Drain();
    rc_ = rc;
    return true;
  }
  int rc() const { return rc_; }
  bool killed() const { return killed_; }  // by the churn, on purpose
  bool hung() const { return hung_; }      // past its deadline
  const std::string& what() const { return what_; }
  const std::string& output() const { return child_.output(); }

 private:
  static constexpr int kRunning = -100;
  std::string what_;
  Child child_;
  int64_t deadline_ms_, kill_at_ms_;
  int rc_ = kRunning;
  bool killed_ = false, hung_ = false;
};

// What the churn did.
struct Tally {
  int churn_trainers = 0, churn_killed = 0, churn_ok = 0, churn_failed_cleanly = 0;
  int hostile_sessions = 0, bad_descriptors = 0, hostile_calls = 0, hostile_conns = 0;
  std::vector<std::string> problems;  // hangs and unexpected exits
  void Problem(const std::string& p) {
    if (problems.size() < 20) problems.push_back(p);
  }
};

class SoakTest : public ClusterFixture {
 protected:
  // A child that drops to uid 65534 (root only) before talking to a daemon.
  static bool BecomeNobody() {
    if (::geteuid() != 0) return false;
    return ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0;
  }

  void MakeSocketsReachable() {
    for (auto& d : daemons_) ::chmod(d->dir.path().c_str(), 0755);
  }
};

// --- the verified job --------------------------------------------------------

// Runs checked collectives until rank 0 sees `stop` (agreed through a MIN
// all-reduce, itself checked). Prints "iterations N" at the end; returns 0
// only if every operation completed OK with the right values.
int VerifiedRank(Trainer* T, const std::string& stop, const std::string& progress) {
  Group g;
  if (!MakeGroup(T, {0, 1}, &g)) return 3;
  const ReduceOptions sum{};
  ReduceOptions min_op;
  min_op.op = ReduceOp::kMin;
  int64_t iterations = 0;
  for (;;) {
    // Agree on whether to go on: 1 unless rank 0 saw the stop file.
    const int32_t go = (T->rank == 0 && Exists(stop)) ? 0 : 1;
    std::memcpy(T->At(T->send), &go, sizeof(go));
    if (!Await(T, T->client->AllReduce(g, {T->send.id, 0}, {T->recv.id, 0}, 1, DataType::kInt32,
                                       min_op),
               "go/stop all-reduce")) {
      break;
    }
    int32_t agreed = -1;
    std::memcpy(&agreed, T->At(T->recv), sizeof(agreed));
    if (agreed != 0 && agreed != 1) T->Fail("go/stop all-reduce gave " + std::to_string(agreed));
    if (agreed != 1) break;
    const uint64_t n = 256 + (iterations * 97) % 8192;
    AllReduceCase(T, g, DataType::kFloat32, sum, n);
    AllGatherCase(T, g, DataType::kBFloat16, n / 2 + 1);
    ReduceScatterCase(T, g, DataType::kInt32, sum, n / 4 + 1);
    if (T->failures > 0) break;
    if (++iterations % 20 == 0) WriteFile(progress + std::to_string(T->rank), std::to_string(iterations));
  }
  std::fprintf(T->out, "rank %d iterations %lld failures %d\n", T->rank,
               static_cast<long long>(iterations), T->failures);
  return T->failures == 0 ? 0 : 4;
}

// --- churn -------------------------------------------------------------------

// One churn trainer: attach, group, a few checked all-reduces, then leave
// one of three ways. Exit 0, or 3 (attach / group refused: the node was
// down or the peer died first), or 4 (an operation failed: the peer died).
int ChurnRank(const std::string& socket, const std::string& job, int rank, int how, int ops,
              FILE* out) {
  Trainer T;
  T.out = out;
  T.world = 2;
  // A churn trainer fails fast when its node's daemon is killed (the tally
  // counts it as failed cleanly); reconnecting is tested elsewhere.
  if (!Attach(&T, socket, job, rank, 2, /*reconnect=*/false)) return 3;
  Group g;
  if (!MakeGroup(&T, {0, 1}, &g)) return 3;
  for (int i = 0; i < ops && T.failures == 0; ++i) {
    AllReduceCase(&T, g, DataType::kFloat32, {}, 64 + 61 * i);
  }
  if (how == 0) (void)T.client->Detach();
  if (how == 1) _exit(T.failures == 0 ? 0 : 4);  // no detach, no destructors
  return T.failures == 0 ? 0 : 4;
}

// --- hostile sessions --------------------------------------------------------

int HostileSession(const std::string& socket, const std::string& job, uint64_t seed, FILE* out) {
  std::mt19937_64 rng(seed);
  RawSession s;
  if (!s.Open(socket, job, 0, 1).ok()) return 3;  // the node may be down
  char* data = nullptr;
  absl::StatusOr<uint64_t> buf = s.RegisterBuffer(1 << 16, &data);
  absl::StatusOr<uint32_t> gid = s.NewGroup({0});
  if (!buf.ok() || !gid.ok()) return 3;
  int pushed = 0;
  const int n = 8 + static_cast<int>(rng() % 24);
  for (int i = 1; i <= n; ++i) {
    shm::OpDescriptor d{};
    if (rng() % 3 == 0) {  // garbage
      auto* w = reinterpret_cast<uint64_t*>(&d);
      for (size_t k = 0; k < sizeof(d) / 8; ++k) w[k] = rng();
    } else {  // a valid all-reduce with one byte changed
      d.seq = static_cast<uint64_t>(i);
      d.count = 64;
      d.send = {*buf, 0};
      d.recv = {*buf, 4096};
      d.premul_factor = d.pre_divide = d.post_divide = 1.0;
      d.group_id = *gid;
      d.epoch = 1;
      d.collective = static_cast<uint8_t>(Collective::kAllReduce);
      d.dtype = static_cast<uint8_t>(DataType::kFloat32);
      d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
      reinterpret_cast<uint8_t*>(&d)[8 + rng() % (sizeof(d) - 8)] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    d.op_id = static_cast<uint64_t>(i);
    s.Push(d);
    ++pushed;
    (void)s.Completion(d.op_id, 200);  // some never complete (a future seq, a wrong epoch)
  }
  if (rng() % 4 == 0) {  // an impossible head: the daemon ends the session
    s.header()->head.store(rng());
    s.Bell();
  }
  std::fprintf(out, "pushed %d\n", pushed);
  return 0;
}

// --- hostile callers ---------------------------------------------------------

void GarbageConnection(const std::string& socket, std::mt19937_64& rng) {
  absl::StatusOr<UniqueFd> c = ConnectUnix(socket);
  if (!c.ok()) return;
  std::string bytes;
  switch (rng() % 3) {
    case 0: bytes = std::string(shm::kDataHelloMagic, 8); break;
    case 1: bytes = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"; break;
    default: break;
  }
  const size_t n = rng() % 200;
  for (size_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(rng()));
  (void)::send(c->get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (rng() % 2) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
}

// Random calls; with `others` (another uid than the verified job's), also on
// random session ids, which must all be refused.
int HostileCaller(const std::string& socket, uint64_t seed, bool others, FILE* out) {
  std::mt19937_64 rng(seed);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto channel = grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args);
  auto node = v1::Node::NewStub(channel);
  auto admin = v1::Admin::NewStub(channel);
  int calls = 0, conns = 0;
  auto ctx = [](grpc::ClientContext* c) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
  };
  std::vector<uint64_t> mine;
  for (int i = 0; i < 12; ++i) {
    const uint64_t victim = others ? 1 + rng() % 64 : (mine.empty() ? 1ull << 50 : mine[rng() % mine.size()]);
    grpc::ClientContext c;
    ctx(&c);
    ++calls;
    switch (rng() % 7) {
      case 0: {
        v1::AttachRequest req;
        req.set_job_id(rng() % 4 ? "hostile" : std::string(rng() % 300, 'x'));
        req.set_rank(static_cast<int32_t>(rng() % 5) - 1);
        req.set_world_size(static_cast<int32_t>(rng() % 5) - 1);
        req.set_device(rng() % 2 ? "cpu" : "cuda:7");
        req.set_protocol_version(rng() % 2 ? shm::kLayoutVersion : static_cast<uint32_t>(rng()));
        req.set_features(rng());
        if (rng() % 3 == 0) req.set_owner_uid(0);
        v1::AttachResponse resp;
        if (node->Attach(&c, req, &resp).ok()) mine.push_back(resp.session_id());
        break;
      }
      case 1: {
        v1::DetachRequest req;
        req.set_session_id(victim);
        v1::DetachResponse resp;
        (void)node->Detach(&c, req, &resp);
        break;
      }
      case 2: {
        v1::NewGroupRequest req;
        req.set_session_id(victim);
        for (int k = rng() % 4; k > 0; --k) req.add_ranks(static_cast<int32_t>(rng() % 5) - 1);
        if (rng() % 3 == 0) req.set_rejoin_group_id(static_cast<uint32_t>(rng() % 8));
        v1::NewGroupResponse resp;
        (void)node->NewGroup(&c, req, &resp);
        break;
      }
      case 3: {
        v1::RegisterBufferRequest req;  // an fd that never comes
        req.set_session_id(victim);
        req.set_fd_tag(1 + rng() % 8);
        req.set_size_bytes(rng() % 2 ? 4096 : rng());
        v1::RegisterBufferResponse resp;
        (void)node->RegisterBuffer(&c, req, &resp);
        break;
      }
      case 4: {
        v1::FreeBufferRequest req;
        req.set_session_id(victim);
        req.set_buffer_id(rng() % 4);
        v1::FreeBufferResponse resp;
        (void)node->FreeBuffer(&c, req, &resp);
        break;
      }
      case 5: {
        v1::StatusRequest req;
        v1::StatusResponse resp;
        if (admin->Status(&c, req, &resp).ok() && others) {
          for (const auto& s : resp.sessions()) {
            if (s.peer_uid() != kNobody && s.owner_uid() != kNobody) {
              std::fprintf(out, "FAIL: uid %u sees session %llu of uid %u\n", kNobody,
                           static_cast<unsigned long long>(s.session_id()), s.peer_uid());
              return 6;
            }
          }
        }
        break;
      }
      default:
        --calls;
        ++conns;
        GarbageConnection(socket, rng);
        break;
    }
  }
  std::fprintf(out, "calls %d conns %d\n", calls, conns);
  return 0;
}

TEST_F(SoakTest, ClusterUnderChurnAndHostileInputLeaksNothing) {
  const int seconds = SoakSeconds();
  const bool as_nobody = ::geteuid() == 0;
  // Another uid may connect (hostile callers run as 65534 when we are root).
  StartCluster(kNodes, /*collective_ms=*/10000, /*join_timeout_ms=*/4000,
               as_nobody ? "node:\n  socket_mode: 0666\n  allowed_uids: [0, 65534]\n" : "");
  if (HasFatalFailure()) return;
  MakeSocketsReachable();
  const std::string victim_yaml = ReadFile(daemons_[kVictim]->dir.File("node.yaml"));

  // The verified job, on nodes 0 and 1.
  const std::string stop = shared_.File("stop");
  const std::string progress = shared_.File("progress");
  std::vector<std::unique_ptr<Child>> verified;
  for (int r = 0; r < 2; ++r) {
    const std::string socket = Socket(r);
    verified.push_back(std::make_unique<Child>([=](FILE* out) {
      Trainer T;
      T.out = out;
      T.world = 2;
      if (!Attach(&T, socket, "verified", r, 2)) return 2;
      return VerifiedRank(&T, stop, progress);
    }));
  }
  auto verified_iterations = [&](int r) {
    return std::atoll(ReadFile(progress + std::to_string(r)).c_str());
  };
  ASSERT_TRUE(Eventually([&] { return verified_iterations(0) >= 20 && verified_iterations(1) >= 20; },
                         30000))
      << verified[0]->output() << verified[1]->output() << Logs();

  // The churn: at most kChurnPairs trainer pairs, one hostile session and
  // one hostile caller at a time, started and reaped by step() on this
  // thread. Each process has 60 s; one still running then counts as a hang.
  constexpr int kChurnPairs = 2;
  Tally tally;
  uint64_t next_job = 0;
  std::mt19937_64 rng(20240601);
  std::vector<std::unique_ptr<Proc>> procs;
  int pairs_running = 0, sessions_running = 0, callers_running = 0;
  // A pair of trainers on nodes a and b (the same or two).
  auto start_pair_on = [&](int64_t now, int a, int b, bool may_kill) {
    const std::string job = absl::StrCat("churn-", next_job++);
    const int ops = 1 + static_cast<int>(rng() % 20);
    const int victim = may_kill && rng() % 2 ? static_cast<int>(rng() % 2) : -1;
    const int64_t kill_at = now + 1 + static_cast<int64_t>(rng() % 1500);
    for (int r = 0; r < 2; ++r) {
      const std::string socket = Socket(r == 0 ? a : b);
      const int how = static_cast<int>(rng() % 3);
      procs.push_back(std::make_unique<Proc>(
          absl::StrCat("churn trainer ", job, " rank ", r),
          [=](FILE* out) { return ChurnRank(socket, job, r, how, ops, out); }, now + 60000,
          r == victim ? kill_at : 0));
    }
    ++pairs_running;
  };
  auto start_pair = [&](int64_t now) {
    const int a = static_cast<int>(rng() % kNodes);
    const int b = rng() % 2 ? a : static_cast<int>(rng() % kNodes);
    start_pair_on(now, a, b, /*may_kill=*/true);
  };
  auto start_session_on = [&](int64_t now, int node, bool may_kill) {
    const std::string socket = Socket(node);
    const std::string job = absl::StrCat("hostile-", next_job++);
    const uint64_t seed = rng();
    const int64_t kill_at =
        may_kill && rng() % 4 == 0 ? now + 1 + static_cast<int64_t>(rng() % 300) : 0;
    procs.push_back(std::make_unique<Proc>(
        "hostile session " + job, [=](FILE* out) { return HostileSession(socket, job, seed, out); },
        now + 60000, kill_at));
    ++sessions_running;
  };
  auto start_caller_on = [&](int64_t now, int node) {
    const std::string socket = Socket(node);
    const uint64_t seed = rng();
    procs.push_back(std::make_unique<Proc>(
        "hostile caller",
        [=](FILE* out) { return HostileCaller(socket, seed, BecomeNobody(), out); }, now + 60000,
        0));
    ++callers_running;
  };
  // Reaps what ended and accounts for it; with `more`, starts new churn up
  // to its limits. False once nothing is left running.
  auto step = [&](bool more) {
    const int64_t now = NowMs();
    for (auto it = procs.begin(); it != procs.end();) {
      Proc& p = **it;
      if (!p.Poll(now)) {
        ++it;
        continue;
      }
      const int rc = p.rc();
      const std::string& w = p.what();
      if (p.hung()) tally.Problem(w + " hung (60 s):\n" + p.output());
      if (w.rfind("churn", 0) == 0) {
        ++tally.churn_trainers;
        pairs_running -= w.back() == '1';  // a pair counts until its rank 1 ended
        if (p.killed()) ++tally.churn_killed;
        if (rc == 0) ++tally.churn_ok;
        if (rc == 3 || rc == 4) ++tally.churn_failed_cleanly;
        if (!p.hung() && rc != 0 && rc != 3 && rc != 4 && !p.killed()) {
          tally.Problem(absl::StrCat(w, " exited ", rc, ":\n", p.output()));
        }
      } else if (w.rfind("hostile session", 0) == 0) {
        --sessions_running;
        ++tally.hostile_sessions;
        if (const size_t at = p.output().find("pushed "); at != std::string::npos) {
          tally.bad_descriptors += std::atoi(p.output().c_str() + at + 7);
        }
        if (!p.hung() && rc != 0 && rc != 3 && !p.killed()) {
          tally.Problem(absl::StrCat(w, " exited ", rc, ":\n", p.output()));
        }
      } else {
        --callers_running;
        int calls = 0, conns = 0;
        if (const size_t at = p.output().find("calls "); at != std::string::npos) {
          std::sscanf(p.output().c_str() + at, "calls %d conns %d", &calls, &conns);
        }
        tally.hostile_calls += calls;
        tally.hostile_conns += conns;
        if (!p.hung() && rc != 0) tally.Problem(absl::StrCat(w, " exited ", rc, ":\n", p.output()));
      }
      it = procs.erase(it);
    }
    if (more) {
      while (pairs_running < kChurnPairs) start_pair(now);
      if (sessions_running == 0) start_session_on(now, static_cast<int>(rng() % kNodes), true);
      if (callers_running == 0) start_caller_on(now, static_cast<int>(rng() % kNodes));
    }
    return !procs.empty();
  };
  auto run_until = [&](int64_t end_ms) {
    while (NowMs() < end_ms) {
      step(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  auto drain = [&] {
    while (step(false)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  // Everything a node creates once, on first use (its transport to each
  // other node, the pools' first threads): a pair on each pair of nodes in
  // `nodes`, one on each node alone, a hostile session and caller on each.
  auto warm_up = [&](const std::vector<int>& nodes) {
    const int64_t now = NowMs();
    for (int a : nodes) {
      for (int b = 0; b < kNodes; ++b) start_pair_on(now, a, b, /*may_kill=*/false);
      start_session_on(now, a, /*may_kill=*/false);
      start_caller_on(now, a);
    }
    drain();
  };
  // Waits until the session tables hold only the verified job (1 session on
  // nodes 0 and 1, none on node 2) and no daemon keeps the engine state of a
  // cross-node group whose job ended (it goes about 2 heartbeats after).
  auto quiesce = [&] {
    auto tables_settled = [&] {
      for (int i = 0; i < kNodes; ++i) {
        const ProcStats st = Measure(daemons_[i]->process.pid(), Socket(i));
        const int want = i < 2 ? 1 : 0;
        if (st.sessions != want || st.jobs != want || st.retired_groups != 0) return false;
      }
      return true;
    };
    return Eventually(tables_settled, 30000);
  };

  warm_up({0, 1, 2});
  ASSERT_TRUE(tally.problems.empty()) << tally.problems[0] << Logs();
  tally = Tally{};
  ASSERT_TRUE(quiesce()) << Logs();
  std::vector<ProcStats> before(kNodes);
  for (int i = 0; i < kNodes; ++i) {
    before[i] = Measure(daemons_[i]->process.pid(), Socket(i));
    std::printf("soak: node %d before: %s\n", i, before[i].ToString().c_str());
  }
  const int64_t iterations_before = std::min(verified_iterations(0), verified_iterations(1));

  // The soak: churn throughout; node 2 SIGKILLed a third of the way in and
  // restarted 5 s later. Its new process's baseline is taken once it has
  // rejoined and warmed up (the churn pauses for that, the verified job
  // does not).
  const int64_t start = NowMs();
  run_until(start + int64_t{seconds} * 1000 / 3);
  daemons_[kVictim]->process.Kill();
  const int64_t killed_at = NowMs();
  bool lost_seen = false;
  while (NowMs() < killed_at + 5000) {
    step(true);
    if (!lost_seen) {
      v1::NodesResponse view;
      lost_seen = QueryNodes(Socket(0), &view) && StateOf(view, kVictim) == "lost";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(lost_seen) << "node " << kVictim << " was not declared lost within 5 s\n" << Logs();
  ASSERT_TRUE(daemons_[kVictim]->process.Start(victim_yaml, {}, {}, /*wait_ready=*/true))
      << daemons_[kVictim]->log();
  MakeSocketsReachable();
  bool back = false;
  while (!back && NowMs() < killed_at + 25000) {
    step(true);
    v1::NodesResponse view;
    back = QueryNodes(Socket(0), &view) && AliveNodes(view) == kNodes;
  }
  ASSERT_TRUE(back) << "node " << kVictim << " did not rejoin\n" << Logs();
  const int64_t rejoined_s = (NowMs() - killed_at) / 1000;
  drain();
  warm_up({kVictim});
  EXPECT_TRUE(quiesce()) << Logs();
  before[kVictim] = Measure(daemons_[kVictim]->process.pid(), Socket(kVictim));
  std::printf("soak: node %d killed at %llds, rejoined after %llds; restarted process before: %s\n",
              kVictim, static_cast<long long>((killed_at - start) / 1000),
              static_cast<long long>(rejoined_s), before[kVictim].ToString().c_str());
  run_until(std::max(NowMs() + int64_t{seconds} * 1000 / 3, start + int64_t{seconds} * 1000));
  drain();
  std::printf("soak: %d s of churn: %d churn trainers (%d SIGKILLed at a random point, %d "
              "finished OK, %d refused or failed cleanly because of a peer or node), %d hostile "
              "sessions (%d bad descriptors), %d hostile calls, %d garbage connections\n",
              static_cast<int>((NowMs() - start) / 1000), tally.churn_trainers,
              tally.churn_killed, tally.churn_ok, tally.churn_failed_cleanly,
              tally.hostile_sessions, tally.bad_descriptors, tally.hostile_calls,
              tally.hostile_conns);
  for (const std::string& p : tally.problems) ADD_FAILURE() << p;
  for (int i = 0; i < kNodes; ++i) {
    EXPECT_TRUE(daemons_[i]->process.Alive()) << "daemon " << i << " died:\n" << daemons_[i]->log();
  }

  // Back to the baseline. Strictly: fds, sessions, jobs, every thread but
  // the cross-node engine's on-demand pool ("hsdp-xworker": it grows with
  // the cross-node operations in flight at once, up to 64 workers, and does
  // not shrink), and every file or memfd mapping. The anonymous mappings
  // (thread stacks, glibc's arenas and its cache of exited threads' stacks)
  // and RSS (glibc keeps freed memory) within stated slack.
  EXPECT_TRUE(quiesce()) << Logs();
  // A cross-node rendezvous still waiting for a peer that was killed holds
  // its Gloo pair's listening socket until its own deadline (a slow teardown,
  // not a leak: a leak never comes back). Up to 60 s for every node's fds to
  // return to the baseline; what remains after that is a leak.
  const int64_t settle_start = NowMs();
  for (int i = 0; i < kNodes; ++i) {
    Eventually([&] { return Measure(daemons_[i]->process.pid(), Socket(i)).fds <= before[i].fds; },
               std::max<int64_t>(0, 60000 - (NowMs() - settle_start)));
  }
  std::printf("soak: fds settled after %lld ms\n", static_cast<long long>(NowMs() - settle_start));
  for (int i = 0; i < kNodes; ++i) {
    const ProcStats after = Measure(daemons_[i]->process.pid(), Socket(i));
    std::printf("soak: node %d after:  %s\n", i, after.ToString().c_str());
    EXPECT_EQ(after.sessions, before[i].sessions) << "node " << i;
    EXPECT_EQ(after.jobs, before[i].jobs) << "node " << i;
    // One-sided: a leak only adds. A restarted node's baseline is taken while
    // it may still hold a transient descriptor of its rejoin (seen: 34 then 33).
    EXPECT_LE(after.fds, before[i].fds) << "node " << i << ":\n"
                                        << Diff(before[i].fd_kinds, after.fd_kinds);
    std::map<std::string, int> threads_before = before[i].thread_names;
    std::map<std::string, int> threads_after = after.thread_names;
    const int pool_growth = threads_after[kPoolThreads] - threads_before[kPoolThreads];
    int grpc_pools = 0, grpc_growth = 0;
    for (const char* name : kGrpcPools) {
      grpc_pools += threads_after[name];
      grpc_growth += threads_after[name] - threads_before[name];
    }
    for (auto* m : {&threads_before, &threads_after}) {
      m->erase(kPoolThreads);
      for (const char* name : kGrpcPools) m->erase(name);
    }
    EXPECT_EQ(threads_after, threads_before) << "node " << i << ":\n"
                                             << Diff(threads_before, threads_after);
    EXPECT_LE(after.thread_names.count(kPoolThreads) ? after.thread_names.at(kPoolThreads) : 0,
              kMaxPoolThreads)
        << "node " << i;
    EXPECT_LE(grpc_pools, kMaxGrpcPoolThreads) << "node " << i;
    EXPECT_EQ(Named(after.map_kinds), Named(before[i].map_kinds))
        << "node " << i << ":\n" << Diff(Named(before[i].map_kinds), Named(after.map_kinds));
    const int anon_growth = Anonymous(after.map_kinds) - Anonymous(before[i].map_kinds);
    EXPECT_LE(anon_growth, 2 * (std::max(pool_growth, 0) + std::max(grpc_growth, 0)) + kAnonSlack)
        << "node " << i << ":\n" << Diff(before[i].map_kinds, after.map_kinds);
    if (kRssSlackKb >= 0) {
      EXPECT_LE(after.rss_kb, before[i].rss_kb + kRssSlackKb) << "node " << i;
    }
    std::printf("soak: node %d: cross-node pool %+d threads, gRPC pools %+d threads, anonymous "
                "mappings %+d, RSS %+ld KiB\n",
                i, pool_growth, grpc_growth, anon_growth, after.rss_kb - before[i].rss_kb);
  }

  // The verified job lost nothing: it ran throughout, every result checked.
  WriteFile(stop, "");
  for (int r = 0; r < 2; ++r) {
    const int rc = verified[r]->Finish(60000);
    EXPECT_EQ(rc, 0) << "verified rank " << r << ":\n" << verified[r]->output() << Logs();
    std::printf("soak: verified %s", verified[r]->output().c_str());
  }
  const int64_t iterations = std::min(verified_iterations(0), verified_iterations(1));
  EXPECT_GT(iterations, iterations_before) << "the verified job made no progress during the churn";
  std::printf("soak: the verified job ran %lld checked iterations (3 collectives + 1 agreement "
              "each) during the soak\n",
              static_cast<long long>(iterations - iterations_before));
}

}  // namespace
}  // namespace hsdp::testing
