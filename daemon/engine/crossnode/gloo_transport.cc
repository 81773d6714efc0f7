#include "daemon/engine/crossnode/gloo_transport.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/crossnode/gloo_peer_name.h"
#include "daemon/util/shortened_key.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

// Store prefixes: group keys list their ranks, the coordinator bounds key
// sizes (long ones are hashed, the epoch kept).
std::string StorePrefix(const std::string& key, uint32_t epoch) {
  return ShortenedKey(key, absl::StrCat("/", epoch));
}

std::chrono::milliseconds Remaining(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return std::chrono::milliseconds(std::max<int64_t>(1, ms));
}

// What a Gloo exception means for the link. `peer_node` < 0: unknown.
absl::Status FromGloo(const std::string& what, int peer_node, const std::string& doing) {
  const std::string who = peer_node >= 0 ? absl::StrCat("node ", peer_node) : "a peer";
  if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos) {
    return absl::DeadlineExceededError(
        absl::StrCat("no answer from ", who, " before the deadline (", doing, ": ", what, ")"));
  }
  return absl::UnavailableError(absl::StrCat("connection to ", who, " lost (", doing, ": ", what,
                                             ")"));
}

// Forwards to `inner` and remembers the keys set through it, so the link can
// release exactly what its rendezvous wrote.
class RecordingStore : public gloo::rendezvous::Store {
 public:
  explicit RecordingStore(std::unique_ptr<gloo::rendezvous::Store> inner)
      : inner_(std::move(inner)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_->set(key, data);
    std::lock_guard<std::mutex> l(mu_);
    keys_.push_back(key);
  }
  std::vector<char> get(const std::string& key) override { return inner_->get(key); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }
  std::vector<std::string> keys() {
    std::lock_guard<std::mutex> l(mu_);
    return keys_;
  }

 private:
  const std::unique_ptr<gloo::rendezvous::Store> inner_;
  std::mutex mu_;
  std::vector<std::string> keys_;
};

// Runs `release` once (the rendezvous keys of one link).
using ReleaseOnce = std::function<void()>;

std::string InstanceKey(int index) { return absl::StrCat("instance/", index); }

// The instance link peer `index` wrote, or "" when it wrote none (a daemon
// that does not) or wrote more than an instance id can be: a peer's bytes
// are only compared, never trusted further.
std::string PeerInstance(gloo::rendezvous::Store& store, int index) {
  constexpr size_t kMaxInstance = 64;
  try {
    store.wait({InstanceKey(index)}, std::chrono::milliseconds(1));
    const std::vector<char> v = store.get(InstanceKey(index));
    if (v.empty() || v.size() > kMaxInstance) return "";
    return std::string(v.begin(), v.end());
  } catch (...) {
    return "";
  }
}

class GlooLink : public NodeLink {
 public:
  // One context per device; messages of at least `stripe_min_bytes` are
  // striped across them, smaller ones spread by part.
  GlooLink(std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts,
           std::vector<int> nodes, int self, size_t stripe_min_bytes, ReleaseOnce release,
           std::vector<std::string> instances)
      : contexts_(std::move(contexts)), nodes_(std::move(nodes)), self_(self),
        stripe_min_bytes_(std::max<size_t>(1, stripe_min_bytes)), release_(std::move(release)),
        instances_(std::move(instances)) {}

  ~GlooLink() override {
    std::lock_guard<std::mutex> l(mu_);
    CloseLocked();
  }

  const std::vector<int>& nodes() const override { return nodes_; }
  int self() const override { return self_; }
  std::string peer_instance(int peer) const override {
    return peer >= 0 && peer < static_cast<int>(instances_.size()) ? instances_[peer] : "";
  }

  absl::Status Exchange(const std::vector<SendRange>& sends, const std::vector<RecvRange>& recvs,
                        uint64_t tag, absl::Time deadline) override {
    const int n = static_cast<int>(nodes_.size());
    std::vector<Posted> posted;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!broken_.ok()) return broken_;
      if (absl::Status s = CheckExchange(sends, recvs, n, self_); !s.ok()) return BreakLocked(s);
      int posting = -1;  // the link peer Gloo was given when it threw
      try {
        for (const RecvRange& r : recvs) {
          posting = r.peer;
          Post(true, r.peer, r.data, r.bytes, Slot(tag, r.part), r.part, &posted);
        }
        for (const SendRange& s : sends) {
          posting = s.peer;
          Post(false, s.peer, const_cast<void*>(s.data), s.bytes, Slot(tag, s.part), s.part,
               &posted);
        }
      } catch (const std::exception& e) {
        // A pair whose peer died throws here: name that node, as Wait does.
        return BreakLocked(FromGloo(e.what(), nodes_[posting], "posting"));
      } catch (...) {
        return BreakLocked(absl::UnavailableError(
            absl::StrCat("posting to node ", nodes_[posting], ": unknown error in Gloo")));
      }
      for (Posted& p : posted) active_.push_back(&p);
    }
    absl::Status status = Wait(posted, deadline);
    if (status.ok() && release_) {
      // Every participant finished connecting (they all exchanged with us):
      // the rendezvous keys are no longer read.
      ReleaseOnce release = std::move(release_);
      release_ = nullptr;
      release();
    }
    std::lock_guard<std::mutex> l(mu_);
    active_.clear();
    if (!status.ok() || !broken_.ok()) {
      // Closing first stops Gloo from touching the buffers once we return.
      status = BreakLocked(status.ok() ? broken_ : status);
    }
    posted.clear();
    return status;
  }

  void Abort(const absl::Status& why) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_.ok()) return;
    broken_ = why;
    if (active_.empty()) {
      CloseLocked();
      return;
    }
    // The Exchange in progress wakes up and closes the link itself.
    for (Posted* p : active_) {
      if (p->recv) {
        p->buf->abortWaitRecv();
      } else {
        p->buf->abortWaitSend();
      }
    }
  }

 private:
  struct Posted {
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    bool recv = false;
    int peer = 0;  // link index
  };

  static uint64_t Slot(uint64_t tag, uint32_t part) {
    return (tag & 0xffffffffull) << 32 | part;
  }

  // Posts one message, striped over the contexts when large (both ends
  // split the same way: they agree on every size).
  void Post(bool recv, int peer, void* data, size_t bytes, uint64_t slot, uint32_t part,
            std::vector<Posted>* out) {
    const size_t d = contexts_.size();
    const size_t stripes = bytes >= stripe_min_bytes_ ? d : 1;
    for (size_t k = 0; k < stripes; ++k) {
      const size_t b = bytes * k / stripes, e = bytes * (k + 1) / stripes;
      gloo::rendezvous::Context& ctx = *contexts_[stripes == 1 ? part % d : k];
      Posted p;
      p.recv = recv;
      p.peer = peer;
      p.buf = ctx.createUnboundBuffer(static_cast<char*>(data) + b, e - b);
      if (recv) {
        p.buf->recv(peer, slot, 0, e - b);
      } else {
        p.buf->send(peer, slot, 0, e - b);
      }
      out->push_back(std::move(p));
    }
  }

  absl::Status Wait(std::vector<Posted>& posted, absl::Time deadline) {
    for (Posted& p : posted) {
      const int peer = nodes_[p.peer];
      try {
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("no answer from node ", peer, " before the deadline"));
        }
        const bool done = p.recv ? p.buf->waitRecv(nullptr, Remaining(deadline))
                                 : p.buf->waitSend(nullptr, Remaining(deadline));
        if (!done) return Aborted();
      } catch (const std::exception& e) {
        return FromGloo(e.what(), peer, p.recv ? "receiving" : "sending");
      } catch (...) {
        return absl::UnavailableError(absl::StrCat(p.recv ? "receiving from" : "sending to",
                                                   " node ", peer, ": unknown error"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Aborted() {
    std::lock_guard<std::mutex> l(mu_);
    return broken_.ok() ? absl::AbortedError("aborted") : broken_;
  }

  absl::Status BreakLocked(absl::Status why) {
    if (broken_.ok()) broken_ = std::move(why);
    CloseLocked();
    return broken_;
  }

  void CloseLocked() {
    if (closed_) return;
    closed_ = true;
    for (auto& ctx : contexts_) {
      try {
        ctx->closeConnections();
      } catch (const std::exception& e) {
        HSDP_LOG(Warning) << "closing a Gloo link: " << e.what();
      } catch (...) {
      }
    }
  }

  const std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts_;
  const std::vector<int> nodes_;
  const int self_;
  const size_t stripe_min_bytes_;
  ReleaseOnce release_;  // only touched by Exchange (one at a time)
  const std::vector<std::string> instances_;  // by link index; "" unknown
  std::mutex mu_;
  absl::Status broken_;  // guarded by mu_
  bool closed_ = false;  // guarded by mu_
  std::vector<Posted*> active_;  // the Exchange in progress (for Abort); guarded by mu_
};

class GlooTransport : public TransportFactory {
 public:
  explicit GlooTransport(GlooTransportOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<NodeLink>> Connect(const std::string& key, uint32_t epoch,
                                                    const std::vector<int>& nodes, int this_node,
                                                    absl::Time deadline) override {
    absl::StatusOr<int> self_or = LinkSelfIndex(nodes, this_node);
    if (!self_or.ok()) return self_or.status();
    const int self = *self_or;
    absl::StatusOr<std::vector<std::shared_ptr<gloo::transport::Device>>> devices = Devices();
    if (!devices.ok()) return devices.status();
    const std::string prefix = StorePrefix(key, epoch);
    std::shared_ptr<RecordingStore> store;
    ReleaseOnce release;
    try {
      std::unique_ptr<gloo::rendezvous::Store> inner = options_.store(prefix);
      if (inner == nullptr) return absl::InternalError("no rendezvous store");
      store = std::make_shared<RecordingStore>(std::move(inner));
      if (options_.release) {
        release = [fn = options_.release, prefix, store] {
          const std::vector<std::string> keys = store->keys();
          if (!keys.empty()) fn(prefix, keys);
        };
      }
      // Written before this participant's address: once the mesh is
      // connected, every peer's is there too (unless it does not write one).
      if (!options_.instance.empty()) {
        store->set(InstanceKey(self), std::vector<char>(options_.instance.begin(),
                                                        options_.instance.end()));
      }
      std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts;
      for (size_t k = 0; k < devices->size(); ++k) {
        auto context =
            std::make_shared<gloo::rendezvous::Context>(self, static_cast<int>(nodes.size()));
        context->setTimeout(Remaining(deadline));
        if (k == 0) {
          context->connectFullMesh(*store, (*devices)[k]);
        } else {
          gloo::rendezvous::PrefixStore sub(absl::StrCat("d", k), *store);
          context->connectFullMesh(sub, (*devices)[k]);
        }
        contexts.push_back(std::move(context));
      }
      std::vector<std::string> instances(nodes.size());
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (static_cast<int>(i) != self) instances[i] = PeerInstance(*store, static_cast<int>(i));
      }
      return std::unique_ptr<NodeLink>(new GlooLink(std::move(contexts), nodes, self,
                                                    options_.stripe_min_bytes, std::move(release),
                                                    std::move(instances)));
    } catch (const std::exception& e) {
      absl::Status s = FromGloo(e.what(), -1, "connecting");
      if (release) release();  // the link will not form: its keys are garbage
      if (s.code() == absl::StatusCode::kDeadlineExceeded && store != nullptr) {
        // Name the nodes whose address never appeared (Gloo's key per
        // participant is its index in the link).
        std::vector<int> missing;
        for (size_t i = 0; i < nodes.size(); ++i) {
          if (static_cast<int>(i) == self) continue;
          try {
            store->wait({std::to_string(i)}, std::chrono::milliseconds(1));
          } catch (...) {
            missing.push_back(nodes[i]);
          }
        }
        if (!missing.empty()) {
          s = absl::DeadlineExceededError(absl::StrCat(
              "node(s) [", absl::StrJoin(missing, ", "), "] did not come before the deadline"));
        }
      }
      return absl::Status(s.code(), absl::StrCat("connecting the link of ", prefix, " among nodes [",
                                                 absl::StrJoin(nodes, ", "), "]: ", s.message()));
    } catch (...) {
      if (release) release();
      return absl::UnavailableError(absl::StrCat("connecting the link of ", prefix,
                                                 ": unknown error in Gloo"));
    }
  }

 private:
  absl::StatusOr<std::vector<std::shared_ptr<gloo::transport::Device>>> Devices() {
    std::lock_guard<std::mutex> l(mu_);
    if (!devices_.empty()) return devices_;
    if (!GlooPeerNameGuardActive()) {
      HSDP_LOG(Error) << "Gloo's fromPeerName is not bound to hsdpd's guard "
                         "(daemon/engine/crossnode/gloo_peer_name.h): a connection reset "
                         "during a rendezvous can end this process";
    }
    try {
      for (int k = 0; k < std::max(1, options_.devices); ++k) {
        gloo::transport::tcp::attr attr;
        attr.hostname = options_.data_address;
        devices_.push_back(gloo::transport::tcp::CreateDevice(attr));
      }
      return devices_;
    } catch (const std::exception& e) {
      devices_.clear();
      return absl::UnavailableError(absl::StrCat("cluster.data_address \"",
                                                 options_.data_address,
                                                 "\": cannot bind the Gloo transport: ", e.what()));
    }
  }

  const GlooTransportOptions options_;
  std::mutex mu_;
  std::vector<std::shared_ptr<gloo::transport::Device>> devices_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<TransportFactory> MakeGlooTransport(GlooTransportOptions options) {
  return std::make_unique<GlooTransport>(std::move(options));
}

}  // namespace hsdp
