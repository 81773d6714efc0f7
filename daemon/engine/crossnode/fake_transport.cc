#include "daemon/engine/crossnode/fake_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hsdp {
namespace {

// What one Connect of every participant shares.
struct Session {
  std::vector<int> nodes;
  std::set<int> arrived;  // indices into nodes
  // OK while the endpoint of that index is open.
  std::vector<absl::Status> closed;
  struct Message {
    std::vector<char> data;
    absl::Time ready;
  };
  // (from index, to index, tag, part)
  std::map<std::tuple<int, int, uint64_t, uint32_t>, Message> mail;
};

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return absl::ToChronoTime(std::min(t, absl::Now() + absl::Hours(24)));
}

}  // namespace

struct FakeNetwork::State {
  std::mutex mu;
  std::condition_variable cv;
  std::set<int> killed;
  std::set<int> silent;
  std::map<int, absl::Duration> delay;
  std::map<std::string, std::shared_ptr<Session>> sessions;
  int connects = 0;
};

namespace {

class FakeLink : public NodeLink {
 public:
  FakeLink(std::shared_ptr<FakeNetwork::State> state, std::shared_ptr<Session> session, int self)
      : state_(std::move(state)), session_(std::move(session)), self_(self) {}

  ~FakeLink() override {
    std::lock_guard<std::mutex> l(state_->mu);
    (void)BreakLocked(absl::UnavailableError("the link was closed"));
  }

  const std::vector<int>& nodes() const override { return session_->nodes; }
  int self() const override { return self_; }

  absl::Status Exchange(const std::vector<SendRange>& sends, const std::vector<RecvRange>& recvs,
                        uint64_t tag, absl::Time deadline) override {
    std::unique_lock<std::mutex> l(state_->mu);
    if (!broken_.ok()) return broken_;
    const int n = static_cast<int>(session_->nodes.size());
    if (absl::Status s = CheckExchange(sends, recvs, n, self_); !s.ok()) return BreakLocked(s);
    if (absl::Status s = HealthLocked(); !s.ok()) return BreakLocked(s);
    const bool silent = state_->silent.count(node()) > 0;
    const absl::Time ready = absl::Now() + DelayLocked();
    for (const SendRange& s : sends) {
      if (!session_->closed[s.peer].ok()) return BreakLocked(PeerClosed(s.peer));
      if (silent) continue;
      auto key = std::make_tuple(self_, s.peer, tag, s.part);
      if (session_->mail.count(key) > 0) {
        return BreakLocked(absl::InvalidArgumentError(
            absl::StrCat("two messages with tag ", tag, " part ", s.part, " in flight")));
      }
      const char* p = static_cast<const char*>(s.data);
      session_->mail[key] = Session::Message{std::vector<char>(p, p + s.bytes), ready};
    }
    state_->cv.notify_all();
    std::vector<bool> done(recvs.size(), false);
    size_t left = recvs.size();
    for (;;) {
      absl::Time next = deadline;
      for (size_t i = 0; i < recvs.size(); ++i) {
        if (done[i]) continue;
        const RecvRange& r = recvs[i];
        auto it = session_->mail.find(std::make_tuple(r.peer, self_, tag, r.part));
        if (it != session_->mail.end()) {
          if (it->second.ready > absl::Now()) {
            next = std::min(next, it->second.ready);
            continue;
          }
          if (it->second.data.size() != r.bytes) {
            return BreakLocked(absl::FailedPreconditionError(absl::StrCat(
                "node ", session_->nodes[r.peer], " sent ", it->second.data.size(),
                " bytes for message ", tag, "/", r.part, ", expected ", r.bytes)));
          }
          if (r.bytes > 0) std::memcpy(r.data, it->second.data.data(), r.bytes);
          session_->mail.erase(it);
          done[i] = true;
          --left;
        }
      }
      if (left == 0) return absl::OkStatus();
      if (!broken_.ok()) return broken_;
      if (absl::Status s = HealthLocked(); !s.ok()) return BreakLocked(s);
      for (size_t i = 0; i < recvs.size(); ++i) {
        if (done[i]) continue;
        const int p = recvs[i].peer;
        if (state_->killed.count(session_->nodes[p]) > 0) {
          return BreakLocked(absl::UnavailableError(
              absl::StrCat("node ", session_->nodes[p], " is unreachable (connection lost)")));
        }
        if (!session_->closed[p].ok()) return BreakLocked(PeerClosed(p));
      }
      if (absl::Now() >= deadline) {
        std::set<int> waiting;
        for (size_t i = 0; i < recvs.size(); ++i) {
          if (!done[i]) waiting.insert(session_->nodes[recvs[i].peer]);
        }
        return BreakLocked(absl::DeadlineExceededError(
            absl::StrCat("no answer from node(s) [", absl::StrJoin(waiting, ", "),
                         "] before the deadline")));
      }
      state_->cv.wait_until(l, ToChrono(next));
    }
  }

  void Abort(const absl::Status& why) override {
    std::lock_guard<std::mutex> l(state_->mu);
    (void)BreakLocked(why);
  }

 private:
  int node() const { return session_->nodes[self_]; }

  absl::Duration DelayLocked() const {
    auto it = state_->delay.find(node());
    return it == state_->delay.end() ? absl::ZeroDuration() : it->second;
  }

  absl::Status HealthLocked() const {
    if (state_->killed.count(node()) > 0) {
      return absl::UnavailableError(absl::StrCat("node ", node(), " (this node) was cut off"));
    }
    return absl::OkStatus();
  }

  absl::Status PeerClosed(int peer) const {
    return absl::UnavailableError(absl::StrCat("node ", session_->nodes[peer],
                                               " closed the link (",
                                               session_->closed[peer].message(), ")"));
  }

  // Breaks this end (first error wins) and closes it towards the peers.
  absl::Status BreakLocked(absl::Status why) {
    if (broken_.ok()) {
      broken_ = std::move(why);
      if (session_->closed[self_].ok()) session_->closed[self_] = broken_;
      state_->cv.notify_all();
    }
    return broken_;
  }

  const std::shared_ptr<FakeNetwork::State> state_;
  const std::shared_ptr<Session> session_;
  const int self_;
  absl::Status broken_;  // guarded by state_->mu
};

class FakeTransport : public TransportFactory {
 public:
  FakeTransport(std::shared_ptr<FakeNetwork::State> state, int node)
      : state_(std::move(state)), node_(node) {}

  absl::StatusOr<std::unique_ptr<NodeLink>> Connect(const std::string& key, uint32_t epoch,
                                                    const std::vector<int>& nodes, int this_node,
                                                    absl::Time deadline) override {
    absl::StatusOr<int> self_or = LinkSelfIndex(nodes, this_node);
    if (!self_or.ok()) return self_or.status();
    if (this_node != node_) {  // the fake's own rule: a factory serves one node
      return absl::InvalidArgumentError(
          absl::StrCat("node ", this_node, " connected through node ", node_, "'s factory"));
    }
    const int self = *self_or;
    const std::string rkey = absl::StrCat(key, "/", epoch, "/", absl::StrJoin(nodes, ","));
    std::unique_lock<std::mutex> l(state_->mu);
    if (state_->killed.count(node_) > 0) {
      return absl::UnavailableError(absl::StrCat("node ", node_, " (this node) was cut off"));
    }
    std::shared_ptr<Session> session;
    if (state_->silent.count(node_) == 0) {
      std::shared_ptr<Session>& slot = state_->sessions[rkey];
      if (slot == nullptr || slot->arrived.count(self) > 0) {  // a fresh rendezvous
        slot = std::make_shared<Session>();
        slot->nodes = nodes;
        slot->closed.assign(nodes.size(), absl::OkStatus());
      }
      session = slot;
      session->arrived.insert(self);
      state_->cv.notify_all();
    }
    auto complete = [&] { return session != nullptr && session->arrived.size() == nodes.size(); };
    while (!complete() && absl::Now() < deadline) {
      state_->cv.wait_until(l, ToChrono(deadline));
    }
    if (!complete()) {
      std::vector<int> missing;
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (session == nullptr || session->arrived.count(static_cast<int>(i)) == 0) {
          missing.push_back(nodes[i]);
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "connecting the link of ", key, " (epoch ", epoch, "): node(s) [",
          absl::StrJoin(missing, ", "), "] did not come before the deadline"));
    }
    ++state_->connects;
    return std::unique_ptr<NodeLink>(new FakeLink(state_, session, self));
  }

 private:
  const std::shared_ptr<FakeNetwork::State> state_;
  const int node_;
};

}  // namespace

FakeNetwork::FakeNetwork() : state_(std::make_shared<State>()) {}
FakeNetwork::~FakeNetwork() = default;

std::unique_ptr<TransportFactory> FakeNetwork::MakeTransport(int node) {
  return std::make_unique<FakeTransport>(state_, node);
}

void FakeNetwork::KillNode(int node) {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->killed.insert(node);
  state_->cv.notify_all();
}

void FakeNetwork::SetDelay(int node, absl::Duration delay) {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->delay[node] = delay;
  state_->cv.notify_all();
}

void FakeNetwork::SetSilent(int node, bool silent) {
  std::lock_guard<std::mutex> l(state_->mu);
  if (silent) {
    state_->silent.insert(node);
  } else {
    state_->silent.erase(node);
  }
  state_->cv.notify_all();
}

int FakeNetwork::connects() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->connects;
}

}  // namespace hsdp
