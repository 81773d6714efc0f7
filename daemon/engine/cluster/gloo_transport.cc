#include "daemon/engine/cluster/gloo_transport.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

// Store prefixes longer than this are shortened to a hash (the coordinator
// bounds key sizes; group keys list their ranks).
constexpr size_t kMaxPrefix = 200;

std::string StorePrefix(const std::string& key, uint32_t epoch) {
  std::string p = absl::StrCat(key, "/", epoch);
  if (p.size() <= kMaxPrefix) return p;
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : p) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrCat(p.substr(0, 64), "~", absl::Hex(h, absl::kZeroPad16), "/", epoch);
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

class GlooLink : public NodeLink {
 public:
  GlooLink(std::shared_ptr<gloo::rendezvous::Context> context, std::vector<int> nodes, int self)
      : context_(std::move(context)), nodes_(std::move(nodes)), self_(self) {}

  ~GlooLink() override {
    std::lock_guard<std::mutex> l(mu_);
    CloseLocked();
  }

  const std::vector<int>& nodes() const override { return nodes_; }
  int self() const override { return self_; }

  absl::Status Exchange(const std::vector<SendRange>& sends, const std::vector<RecvRange>& recvs,
                        uint64_t tag, absl::Time deadline) override {
    const int n = static_cast<int>(nodes_.size());
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> send_bufs, recv_bufs;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!broken_.ok()) return broken_;
      for (const SendRange& s : sends) {
        if (s.peer < 0 || s.peer >= n || s.peer == self_) {
          return BreakLocked(absl::InvalidArgumentError(absl::StrCat("send to link peer ", s.peer)));
        }
      }
      for (const RecvRange& r : recvs) {
        if (r.peer < 0 || r.peer >= n || r.peer == self_) {
          return BreakLocked(
              absl::InvalidArgumentError(absl::StrCat("receive from link peer ", r.peer)));
        }
      }
      try {
        for (const RecvRange& r : recvs) {
          recv_bufs.push_back(context_->createUnboundBuffer(r.data, r.bytes));
          recv_bufs.back()->recv(r.peer, Slot(tag, r.part), 0, r.bytes);
        }
        for (const SendRange& s : sends) {
          send_bufs.push_back(
              context_->createUnboundBuffer(const_cast<void*>(s.data), s.bytes));
          send_bufs.back()->send(s.peer, Slot(tag, s.part), 0, s.bytes);
        }
      } catch (const std::exception& e) {
        return BreakLocked(FromGloo(e.what(), -1, "posting"));
      } catch (...) {
        return BreakLocked(absl::UnavailableError("posting: unknown error in Gloo"));
      }
      for (auto& b : recv_bufs) active_recv_.push_back(b.get());
      for (auto& b : send_bufs) active_send_.push_back(b.get());
    }
    absl::Status status = Wait(recvs, recv_bufs, sends, send_bufs, deadline);
    std::lock_guard<std::mutex> l(mu_);
    active_recv_.clear();
    active_send_.clear();
    if (!status.ok() || !broken_.ok()) {
      // Closing first stops Gloo from touching the buffers once we return.
      status = BreakLocked(status.ok() ? broken_ : status);
    }
    recv_bufs.clear();
    send_bufs.clear();
    return status;
  }

  void Abort(const absl::Status& why) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_.ok()) return;
    broken_ = why;
    if (active_recv_.empty() && active_send_.empty()) {
      CloseLocked();
      return;
    }
    // The Exchange in progress wakes up and closes the link itself.
    for (auto* b : active_recv_) b->abortWaitRecv();
    for (auto* b : active_send_) b->abortWaitSend();
  }

 private:
  static uint64_t Slot(uint64_t tag, uint32_t part) {
    return (tag & 0xffffffffull) << 32 | part;
  }

  absl::Status Wait(const std::vector<RecvRange>& recvs,
                    const std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& rb,
                    const std::vector<SendRange>& sends,
                    const std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& sb,
                    absl::Time deadline) {
    for (size_t i = 0; i < rb.size(); ++i) {
      const int peer = nodes_[recvs[i].peer];
      try {
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("no answer from node ", peer, " before the deadline"));
        }
        if (!rb[i]->waitRecv(nullptr, Remaining(deadline))) return Aborted();
      } catch (const std::exception& e) {
        return FromGloo(e.what(), peer, "receiving");
      } catch (...) {
        return absl::UnavailableError(absl::StrCat("receiving from node ", peer, ": unknown error"));
      }
    }
    for (size_t i = 0; i < sb.size(); ++i) {
      const int peer = nodes_[sends[i].peer];
      try {
        if (!sb[i]->waitSend(nullptr, Remaining(deadline))) return Aborted();
      } catch (const std::exception& e) {
        return FromGloo(e.what(), peer, "sending");
      } catch (...) {
        return absl::UnavailableError(absl::StrCat("sending to node ", peer, ": unknown error"));
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
    try {
      context_->closeConnections();
    } catch (const std::exception& e) {
      HSDP_LOG(Warning) << "closing a Gloo link: " << e.what();
    } catch (...) {
    }
  }

  const std::shared_ptr<gloo::rendezvous::Context> context_;
  const std::vector<int> nodes_;
  const int self_;
  std::mutex mu_;
  absl::Status broken_;  // guarded by mu_
  bool closed_ = false;  // guarded by mu_
  // The buffers of the Exchange in progress (for Abort); guarded by mu_.
  std::vector<gloo::transport::UnboundBuffer*> active_recv_, active_send_;
};

class GlooTransport : public TransportFactory {
 public:
  explicit GlooTransport(GlooTransportOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<NodeLink>> Connect(const std::string& key, uint32_t epoch,
                                                    const std::vector<int>& nodes, int this_node,
                                                    absl::Time deadline) override {
    if (nodes.size() < 2 || !std::is_sorted(nodes.begin(), nodes.end()) ||
        std::adjacent_find(nodes.begin(), nodes.end()) != nodes.end() ||
        !std::binary_search(nodes.begin(), nodes.end(), this_node)) {
      return absl::InvalidArgumentError(
          absl::StrCat("nodes [", absl::StrJoin(nodes, ", "), "] for node ", this_node));
    }
    const int self =
        static_cast<int>(std::lower_bound(nodes.begin(), nodes.end(), this_node) - nodes.begin());
    absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device = Device();
    if (!device.ok()) return device.status();
    const std::string prefix = StorePrefix(key, epoch);
    std::unique_ptr<gloo::rendezvous::Store> store;
    try {
      store = options_.store(prefix);
      if (store == nullptr) return absl::InternalError("no rendezvous store");
      auto context = std::make_shared<gloo::rendezvous::Context>(self, static_cast<int>(nodes.size()));
      context->setTimeout(Remaining(deadline));
      context->connectFullMesh(*store, *device);
      return std::unique_ptr<NodeLink>(new GlooLink(std::move(context), nodes, self));
    } catch (const std::exception& e) {
      absl::Status s = FromGloo(e.what(), -1, "connecting");
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
      return absl::UnavailableError(absl::StrCat("connecting the link of ", prefix,
                                                 ": unknown error in Gloo"));
    }
  }

 private:
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> Device() {
    std::lock_guard<std::mutex> l(mu_);
    if (device_ != nullptr) return device_;
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options_.data_address;
      device_ = gloo::transport::tcp::CreateDevice(attr);
      return device_;
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("cluster.data_address \"",
                                                 options_.data_address,
                                                 "\": cannot bind the Gloo transport: ", e.what()));
    }
  }

  const GlooTransportOptions options_;
  std::mutex mu_;
  std::shared_ptr<gloo::transport::Device> device_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<TransportFactory> MakeGlooTransport(GlooTransportOptions options) {
  return std::make_unique<GlooTransport>(std::move(options));
}

}  // namespace hsdp
