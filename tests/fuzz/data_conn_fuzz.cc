// Fuzz target: a client of the daemon's Unix socket that does not follow
// the protocol. The real Listener (first 8 bytes: data or gRPC) and
// DataConnServer (hello, then fd messages) run on their own threads, as in
// hsdpd, in front of a real SessionManager; each input attaches a fresh
// session, connects, plays its script and hangs up.
//
// Records (fuzz_input.h), op % 5:
//   0 bytes  payload sent as is
//   1 hello  this input's valid DataHello, XORed with the payload (so the
//            fuzzer starts from a hello that works and bends it)
//   2 fd     [kind: u32][fd_tag: u64][what: u8]: an FdMessage carrying one
//            fd of kind what % 9: sealed memfd, unsealed memfd, pipe, socket,
//            regular file, /dev/null, directory, eventfd, none
//   3 fds    [n: u8][16 bytes]: a message carrying n % 4 memfds at once
//   4 deny   the daemon's uid allow-list refuses this input's uid
// At the end the client shuts its side down and reads until the daemon
// closes the connection.
//
// Oracles beyond "no crash, no sanitizer report": the daemon closes the
// connection once the client hung up (within 5 s), ends the session the
// connection claimed, and afterwards holds exactly the file descriptors it
// held before the input (nothing received is leaked).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HSDP_FUZZ_HAS_SANITIZER 1
#include <sanitizer/common_interface_defs.h>
#endif
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/send_fds.h"  // SendFdsRaw
#include "daemon/auth/peer_registry.h"
#include "daemon/engine/fake/fake_engine.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/server/data_conn_server.h"
#include "daemon/server/listener.h"
#include "daemon/session/shm_channel.h"
#include "fuzz_input.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/layout.h"

namespace hsdp::fuzz {
namespace {

std::atomic<bool> g_deny{false};

// The process's open fds, and what each is ("3 -> socket:[123]").
std::vector<std::string> OpenFds() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) Fail("opendir /proc/self/fd");
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' || std::atoi(e->d_name) == ::dirfd(d)) continue;
    char target[256] = {0};
    const std::string link = absl::StrCat("/proc/self/fd/", e->d_name);
    (void)::readlink(link.c_str(), target, sizeof(target) - 1);
    out.push_back(absl::StrCat(e->d_name, " -> ", target));
  }
  ::closedir(d);
  return out;
}
int CountFds() { return static_cast<int>(OpenFds().size()); }

struct Daemon {
  std::string dir;
  std::string path;
  NodeConfig config;
  FakeStreamEngine engine;
  std::unique_ptr<SessionManager> sessions;
  std::unique_ptr<WakeFd> wake;
  std::unique_ptr<PeerRegistry> peers;
  std::unique_ptr<DataConnServer> server;
  std::unique_ptr<Listener> listener;
  std::string file;  // a regular file to pass
  int baseline = 0;

  Daemon() {
    ::signal(SIGPIPE, SIG_IGN);  // as hsdpd's main() does
    char tmpl[] = "/tmp/hsdp-fuzz-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) Fail("mkdtemp");
    dir = tmpl;
    static std::string* for_cleanup = &dir;  // the daemon lives until exit
    std::atexit([] {
      for (const char* f : {"/hsdpd.sock", "/hsdpd.sock.lock", "/plain-file"}) {
        ::unlink((*for_cleanup + f).c_str());
      }
      ::rmdir(for_cleanup->c_str());
    });
    path = dir + "/hsdpd.sock";
    file = dir + "/plain-file";
    UniqueFd(::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)).Reset();
    config.ring_entries = 16;
    NodeLimits limits;
    limits.max_node_bytes = 1 << 30;
    limits.max_mappings = 100000;
    sessions = std::make_unique<SessionManager>(config, limits, &engine);
    auto w = WakeFd::Create();
    if (!w.ok()) Fail("WakeFd");
    wake = std::move(*w);
    peers = std::make_unique<PeerRegistry>(std::vector<uint32_t>{});
    server = std::make_unique<DataConnServer>(sessions.get(), wake.get(),
                                              [](uint32_t) { return !g_deny.load(); });
    if (!server->Start().ok()) Fail("DataConnServer::Start");
    auto l = Listener::Bind(path, 0600);
    if (!l.ok()) Fail("Listener::Bind: " + l.status().ToString());
    listener = std::move(*l);
    listener->Start(Listener::Options{64, 5000}, peers.get(),
                    [](Listener::Accepted) {},  // gRPC: not this target's business; closed
                    [this](Listener::Accepted c) { server->Adopt(std::move(c)); });
    // The sanitizer runtime starts llvm-symbolizer (two pipes) the first
    // time it names a function, e.g. when libFuzzer prints NEW_FUNC: start
    // it now, so its fds are in the baseline.
#ifdef HSDP_FUZZ_HAS_SANITIZER  // not in the replay build (replay_main.cc)
    char name[256];
    __sanitizer_symbolize_pc(reinterpret_cast<void*>(&CountFds), "%f", name, sizeof(name));
#endif
    baseline = CountFds();
  }
};

UniqueFd Memfd(bool sealed) {
  UniqueFd fd(::memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (::ftruncate(fd.get(), 4096) != 0) Fail("ftruncate");
  if (sealed) ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  return fd;
}

// An fd of kind `what`; a second one to close afterwards goes to `extra`.
UniqueFd MakeFd(int what, const Daemon& d, UniqueFd* extra) {
  int p[2];
  switch (what) {
    case 0: return Memfd(true);
    case 1: return Memfd(false);
    case 2:
      if (::pipe2(p, O_CLOEXEC) != 0) Fail("pipe");
      extra->Reset(p[1]);
      return UniqueFd(p[0]);
    case 3:
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) Fail("socketpair");
      extra->Reset(p[1]);
      return UniqueFd(p[0]);
    case 4: return UniqueFd(::open(d.file.c_str(), O_RDONLY | O_CLOEXEC));
    case 5: return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    case 6: return UniqueFd(::open(d.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    case 7: return UniqueFd(::eventfd(0, EFD_CLOEXEC));
    default: return UniqueFd();
  }
}

void Send(int sock, std::string_view bytes, const std::vector<int>& fds) {
  if (bytes.empty() && fds.empty()) return;
  static const char kDummy = 0;  // fds need at least one byte
  // The daemon may have closed it already.
  (void)testing::SendFdsRaw(sock, bytes.empty() ? &kDummy : bytes.data(),
                            bytes.empty() ? 1 : bytes.size(), fds);
}

// Reads until the daemon closes the connection; false after 5 s.
bool AwaitClose(int sock) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char buf[512];
  while (std::chrono::steady_clock::now() < end) {
    struct pollfd p{sock, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    struct msghdr msg{};
    struct iovec iov{buf, sizeof(buf)};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    // Close the fds a hello reply carries (the channel and the wake-up fd).
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        ::close(fd);
      }
    }
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
  return false;
}

}  // namespace
}  // namespace hsdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsdp;
  using namespace hsdp::fuzz;
  static Daemon* d = new Daemon();
  g_deny.store(false);
  const PeerCred me{::getpid(), ::getuid(), ::getgid()};
  AttachParams p;
  p.job_id = "fuzz";
  p.protocol_version = shm::kLayoutVersion;
  p.features = shm::kFeaturesImplemented;
  absl::StatusOr<AttachResult> a = d->sessions->Attach(p, me);
  if (!a.ok()) Fail("Attach: " + a.status().ToString());
  shm::DataHello hello{};
  std::memcpy(hello.magic, shm::kDataHelloMagic, sizeof(hello.magic));
  hello.version = shm::kLayoutVersion;
  hello.session_id = a->session_id;
  std::memcpy(hello.token, a->token.data(), sizeof(hello.token));

  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, d->path.data(), d->path.size());
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Fail(absl::StrCat("connect: ", std::strerror(errno)));
  }
  Script script(data, size);
  Record r;
  for (int ops = 0; script.Next(&r) && ops < 32; ++ops) {
    Fields f(r.payload);
    switch (r.op % 5) {
      case 0: Send(sock.get(), r.payload, {}); break;
      case 1: {
        shm::DataHello h = hello;
        auto* bytes = reinterpret_cast<uint8_t*>(&h);
        for (size_t i = 0; i < r.payload.size() && i < sizeof(h); ++i) bytes[i] ^= r.payload[i];
        Send(sock.get(), std::string_view(reinterpret_cast<char*>(&h), sizeof(h)), {});
        break;
      }
      case 2: {
        shm::FdMessage m{};
        m.magic = shm::kFdMessageMagic;
        m.kind = f.Get<uint32_t>();
        m.fd_tag = f.Get<uint64_t>();
        UniqueFd extra;
        UniqueFd fd = MakeFd(f.Get<uint8_t>() % 9, *d, &extra);
        std::vector<int> fds;
        if (fd.valid()) fds.push_back(fd.get());
        Send(sock.get(), std::string_view(reinterpret_cast<char*>(&m), sizeof(m)), fds);
        break;
      }
      case 3: {
        const int n = f.Get<uint8_t>() % 4;
        std::vector<UniqueFd> owned;
        std::vector<int> fds;
        for (int i = 0; i < n; ++i) {
          owned.push_back(Memfd(true));
          fds.push_back(owned.back().get());
        }
        const std::string_view rest = f.Rest();
        Send(sock.get(), rest.substr(0, std::min<size_t>(rest.size(), 16)), fds);
        break;
      }
      case 4: g_deny.store(true); break;
    }
  }
  ::shutdown(sock.get(), SHUT_WR);
  HSDP_FUZZ_CHECK(AwaitClose(sock.get()), "the daemon kept the connection open after the client hung up");
  sock.Reset();
  // A claimed session ends when its connection drops (on the server's
  // thread, right after it closed the connection).
  std::shared_ptr<Session> s = d->sessions->FindSession(a->session_id);
  for (int i = 0; i < 500 && s != nullptr && s->data_connected(); ++i) {
    s.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = d->sessions->FindSession(a->session_id);
  }
  HSDP_FUZZ_CHECK(s == nullptr || !s->data_connected(),
                  "the session outlived the data connection that claimed it");
  s.reset();
  d->sessions->EndSession(a->session_id, "fuzz input over");  // never claimed: ends here
  int fds = 0;
  for (int i = 0; i < 500; ++i) {
    fds = CountFds();
    if (fds == d->baseline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  HSDP_FUZZ_CHECK(fds == d->baseline, absl::StrCat("the daemon holds ", fds, " fds, ",
                                                   d->baseline, " before the input: ",
                                                   absl::StrJoin(OpenFds(), ", ")));
  return 0;
}
