// The hierarchical engine's links between daemons (see hierarchical_engine.h):
// one per group key, set of nodes and epoch, connected lazily on a thread of
// its own, cached, and dropped by DestroyGroup or a newer epoch's
// CreateGroup; and running one task over its link (Execute), where an error
// that names a node gets the ranks that node hosts appended.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/crossnode/cross_node_ops.h"
#include "daemon/engine/crossnode/hierarchical_engine_state.h"

namespace hsdp {
namespace hierarchical_internal {
namespace {

// Transport errors name the node ("connection to node 2 lost"); the user
// thinks in ranks: append the ranks of this task hosted by each node named.
absl::Status NameRanksOfNodes(const absl::Status& status, const EngineTask& task) {
  const std::string msg(status.message());
  std::map<int, std::vector<int>> ranks_of;  // remote node -> global ranks
  for (const EngineMember& m : task.members) {
    if (!m.local) ranks_of[m.node].push_back(m.global_rank);
  }
  std::string extra;
  for (const auto& [node, ranks] : ranks_of) {
    const std::string needle = absl::StrCat("node ", node);
    size_t at = msg.find(needle);
    while (at != std::string::npos) {
      const size_t end = at + needle.size();
      if (end >= msg.size() || !std::isdigit(static_cast<unsigned char>(msg[end]))) break;
      at = msg.find(needle, end);
    }
    if (at == std::string::npos) continue;
    constexpr size_t kMaxNamed = 8;
    std::vector<int> shown(ranks.begin(), ranks.begin() + std::min(ranks.size(), kMaxNamed));
    absl::StrAppend(&extra, extra.empty() ? " (" : "; ", "node ", node, " hosts rank",
                    ranks.size() == 1 ? " " : "s ", absl::StrJoin(shown, ", "),
                    ranks.size() > kMaxNamed ? ", ..." : "");
  }
  if (extra.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(msg, extra, ")"));
}

}  // namespace

absl::Status HierarchicalEngine::CreateGroup(const EngineGroupSpec& spec) {
  std::vector<std::shared_ptr<LinkState>> dropped;
  {
    std::lock_guard<std::mutex> l(mu_);
    uint32_t& e = epochs_[spec.key];
    e = std::max(e, spec.epoch);
    DropLinksLocked(spec.key, spec.epoch, &dropped);
  }
  return inner_->CreateGroup(spec);
}

void HierarchicalEngine::DestroyGroup(const std::string& key) {
  std::vector<std::shared_ptr<LinkState>> dropped;
  {
    std::lock_guard<std::mutex> l(mu_);
    DropLinksLocked(key, UINT32_MAX, &dropped);
    const std::string sub = key + "/";
    for (auto it = epochs_.begin(); it != epochs_.end();) {
      if (it->first == key || it->first.compare(0, sub.size(), sub) == 0) {
        it = epochs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  inner_->DestroyGroup(key);
}

std::vector<std::string> HierarchicalEngine::LinkedInstances(const std::string& key,
                                                             uint32_t epoch, int node) const {
  std::vector<std::pair<std::shared_ptr<LinkState>, int>> found;  // link, index of `node`
  {
    std::lock_guard<std::mutex> l(mu_);
    const std::string sub = key + "/";
    for (const auto& [lk, entry] : links_) {
      const std::string& k = lk.first;
      if ((k != key && k.compare(0, sub.size(), sub) != 0) || entry.epoch != epoch) continue;
      auto at = std::find(lk.second.begin(), lk.second.end(), node);
      if (at != lk.second.end()) found.emplace_back(entry.state, int(at - lk.second.begin()));
    }
  }
  std::vector<std::string> out;
  for (const auto& [state, index] : found) {
    std::lock_guard<std::mutex> l(state->mu);
    if (state->link != nullptr) out.push_back(state->link->peer_instance(index));
  }
  return out;
}

void HierarchicalEngine::DropLinksLocked(const std::string& key, uint32_t below_epoch,
                                         std::vector<std::shared_ptr<LinkState>>* dropped) {
  // The group's own links and those of its point-to-point keys ("<key>/...").
  const std::string sub = key + "/";
  for (auto it = links_.begin(); it != links_.end();) {
    const std::string& k = it->first.first;
    if ((k == key || k.compare(0, sub.size(), sub) == 0) && it->second.epoch < below_epoch) {
      dropped->push_back(std::move(it->second.state));
      it = links_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<LinkState>> HierarchicalEngine::AcquireLink(
    const std::shared_ptr<XTask>& xt, const TaskLayout& layout, absl::Time deadline) {
  const EngineTask& t = xt->task;
  std::shared_ptr<LinkState> ls;
  std::shared_ptr<LinkState> replaced;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = epochs_.find(t.group_key); it != epochs_.end() && it->second > t.epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch ", t.epoch, " of the group is over (now ", it->second, ")"));
    }
    LinkEntry& e = links_[LinkKey{t.group_key, layout.nodes}];
    if (e.state != nullptr && e.epoch > t.epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch ", t.epoch, " of the group is over (now ", e.epoch, ")"));
    }
    if (e.state == nullptr || e.epoch < t.epoch) {
      replaced = std::move(e.state);
      e.state = std::make_shared<LinkState>();
      e.epoch = t.epoch;
    }
    ls = e.state;
    xt->link = ls;
  }
  replaced.reset();  // closes the old epoch's link (outside the engine lock)
  {
    std::lock_guard<std::mutex> l(ls->mu);
    if (!ls->failed.ok()) return ls->failed;
    if (ls->link != nullptr) return ls;
  }
  // Connect on a thread of its own, so that Abort and Shutdown need not wait.
  auto pc = std::make_shared<PendingConnect>();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!xt->abort.ok()) return xt->abort;
    xt->connecting = pc;
  }
  const std::string key = absl::StrCat(t.group_key, "|", absl::StrJoin(layout.nodes, ","));
  std::thread([transport = transport_, pc, key, epoch = t.epoch, nodes = layout.nodes,
               this_node = layout.this_node, deadline] {
    auto result = transport->Connect(key, epoch, nodes, this_node, deadline);
    std::lock_guard<std::mutex> l(pc->mu);
    pc->result = std::move(result);
    pc->done = true;
    pc->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(pc->mu);
  pc->cv.wait(l, [&] { return pc->done || !pc->cancelled.ok(); });
  absl::Status status;
  if (!pc->cancelled.ok()) {
    status = pc->cancelled;
  } else if (!pc->result.ok()) {
    status = absl::Status(pc->result.status().code(),
                          absl::StrCat("connecting to nodes [", absl::StrJoin(layout.nodes, ", "),
                                       "]: ", pc->result.status().message()));
  }
  std::unique_ptr<NodeLink> link;
  if (status.ok()) link = std::move(pc->result).value();
  l.unlock();
  std::lock_guard<std::mutex> ll(ls->mu);
  if (!status.ok()) {
    ls->failed = status;
    return status;
  }
  ls->link = std::move(link);
  return ls;
}

absl::Status HierarchicalEngine::Execute(const std::shared_ptr<XTask>& xt, Sidecar* sidecar,
                                         Scratch* scratch, cpu::ThreadPool* pool) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::StatusOr<TaskLayout> layout = MakeTaskLayout(xt->task);
  if (!layout.ok()) return layout.status();
  if (absl::Status s = ValidateCrossNode(xt->task, *layout); !s.ok()) {
    // Not worth a connect; a link already there is broken so that the peers
    // running their part fail now rather than at their deadline.
    std::shared_ptr<LinkState> cached;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = links_.find(LinkKey{xt->task.group_key, layout->nodes});
      if (it != links_.end() && it->second.epoch == xt->task.epoch) cached = it->second.state;
    }
    if (cached != nullptr) {
      std::lock_guard<std::mutex> l(cached->mu);
      if (cached->link != nullptr) cached->link->Abort(s);
    }
    return s;
  }
  absl::StatusOr<std::shared_ptr<LinkState>> ls = AcquireLink(xt, *layout, deadline);
  if (!ls.ok()) return ls.status();
  NodeLink* link;
  {
    std::lock_guard<std::mutex> l((*ls)->mu);
    link = (*ls)->link.get();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!xt->abort.ok()) {
      link->Abort(xt->abort);
      return xt->abort;
    }
  }
  CrossNodeRun run;
  run.link = link;
  run.next_tag = &(*ls)->next_tag;
  run.deadline = deadline;
  run.chunk_bytes = options_.chunk_bytes;
  run.small_allreduce_bytes = options_.small_allreduce_bytes;
  run.sidecar = sidecar;
  run.scratch = scratch;
  run.pool = pool;
  absl::Status status = RunCrossNode(xt->task, *layout, run);
  if (!status.ok()) {
    status = NameRanksOfNodes(status, xt->task);
    link->Abort(status);  // peers must not wait for what will not come
  }
  return status;
}

}  // namespace hierarchical_internal
}  // namespace hsdp
