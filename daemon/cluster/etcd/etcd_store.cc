#include "daemon/cluster/etcd/etcd_store.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"

namespace hsdp {
namespace {

using etcd::Compare;
using etcd::Op;

// etcd refuses transactions of more than 128 operations (--max-txn-ops).
constexpr size_t kMaxTxnOps = 128;

absl::Duration Left(absl::Time deadline) {
  return std::max(absl::Milliseconds(1), deadline - absl::Now());
}


// Holds one of `limit` slots of `count` for its lifetime (ok() false: none left).
class Slot {
 public:
  Slot(std::atomic<size_t>* count, size_t limit) : count_(count) {
    ok_ = count_->fetch_add(1) < limit;
  }
  ~Slot() { count_->fetch_sub(1); }
  bool ok() const { return ok_; }

 private:
  std::atomic<size_t>* count_;
  bool ok_ = false;
};

}  // namespace

EtcdStore::EtcdStore(etcd::EtcdClient* etcd, std::string prefix, KvLimits limits)
    : etcd_(etcd), kv_prefix_(std::move(prefix) + "kv/"), limits_(limits) {}

std::string EtcdStore::name() const { return etcd_->name(); }

absl::Status EtcdStore::Named(const absl::Status& s, const std::string& what) const {
  if (s.ok()) return s;
  // The client's messages name etcd already; the store's own checks do not.
  const bool names_etcd = absl::StartsWith(s.message(), "etcd (");
  return absl::Status(s.code(), absl::StrCat(what, ": ", names_etcd ? "" : name() + ": ",
                                             s.message()));
}

absl::Status EtcdStore::CheckKey(const std::string& key) const { return CheckKvKey(limits_, key); }

absl::Status EtcdStore::CheckValue(const std::string& value) const {
  return CheckKvValue(limits_, value);
}

absl::Status EtcdStore::CheckRoom(absl::Time deadline) const {
  absl::StatusOr<etcd::RangeResult> r =
      etcd_->Range(kv_prefix_, etcd::PrefixEnd(kv_prefix_), Left(deadline), 0, true);
  if (!r.ok()) return r.status();
  if (r->count >= static_cast<int64_t>(limits_.max_keys)) return KvKeysFullError(limits_);
  return absl::OkStatus();
}

absl::Status EtcdStore::CheckRoomFor(const std::string& k, absl::Time deadline,
                                     bool* appeared) const {
  *appeared = false;
  absl::Status room = CheckRoom(deadline);
  if (room.code() != absl::StatusCode::kResourceExhausted) return room;
  // Full, perhaps only because a concurrent caller just created `k` itself.
  absl::StatusOr<etcd::RangeResult> r = etcd_->Range(k, "", Left(deadline), 0, true);
  if (!r.ok()) return r.status();
  if (r->count == 0) return room;
  *appeared = true;
  return absl::OkStatus();
}

absl::Status EtcdStore::Set(const std::string& key, const std::string& value,
                            absl::Duration timeout) {
  const std::string what = absl::StrCat("set \"", key.substr(0, 128), "\"");
  if (absl::Status s = CheckKey(key); !s.ok()) return Named(s, what);
  if (absl::Status s = CheckValue(value); !s.ok()) return Named(s, what);
  const absl::Time deadline = absl::Now() + timeout;
  const std::string k = EtcdKey(key);
  // An update needs no room; a new key does.
  for (;;) {
    absl::StatusOr<etcd::TxnResult> t =
        etcd_->Txn({Compare::Exists(k)}, {Op::Put(k, value, lease_.load())}, {}, Left(deadline));
    if (!t.ok()) return Named(t.status(), what);
    if (t->succeeded) return absl::OkStatus();
    bool appeared = false;
    if (absl::Status s = CheckRoomFor(k, deadline, &appeared); !s.ok()) return Named(s, what);
    if (appeared && absl::Now() < deadline) continue;  // now an update
    return Named(etcd_->Put(k, value, lease_.load(), Left(deadline)).status(), what);
  }
}

absl::Status EtcdStore::PutUnleased(const std::string& key, const std::string& value,
                                    absl::Duration timeout) {
  const std::string what = absl::StrCat("set \"", key.substr(0, 128), "\"");
  if (absl::Status s = CheckKey(key); !s.ok()) return Named(s, what);
  if (absl::Status s = CheckValue(value); !s.ok()) return Named(s, what);
  return Named(etcd_->Put(EtcdKey(key), value, 0, timeout).status(), what);
}

absl::StatusOr<std::string> EtcdStore::Get(const std::string& key, absl::Duration timeout) {
  const std::string what = absl::StrCat("get \"", key.substr(0, 128), "\"");
  if (absl::Status s = CheckKey(key); !s.ok()) return Named(s, what);
  absl::StatusOr<etcd::RangeResult> r = etcd_->Range(EtcdKey(key), "", timeout);
  if (!r.ok()) return Named(r.status(), what);
  if (r->kvs.empty()) return absl::NotFoundError(absl::StrCat("no key \"", key, "\""));
  return std::move(r->kvs.front().value);
}

absl::StatusOr<std::string> EtcdStore::PutIfAbsent(const std::string& key,
                                                   const std::string& value, int64_t lease,
                                                   absl::Time deadline) {
  const std::string k = EtcdKey(key);
  for (int attempt = 0; attempt < 16; ++attempt) {
    absl::StatusOr<etcd::RangeResult> there = etcd_->Range(k, "", Left(deadline));
    if (!there.ok()) return there.status();
    if (!there->kvs.empty()) return std::move(there->kvs.front().value);
    bool appeared = false;
    if (absl::Status s = CheckRoomFor(k, deadline, &appeared); !s.ok()) return s;
    if (appeared) continue;  // read it on the next pass
    absl::StatusOr<etcd::TxnResult> t =
        etcd_->Txn({Compare::Unchanged(k, 0)}, {Op::Put(k, value, lease)}, {Op::Get(k)}, Left(deadline));
    if (!t.ok()) return t.status();
    if (t->succeeded) return value;
    if (!t->ranges.empty() && !t->ranges[0].empty()) return std::move(t->ranges[0][0].value);
    // Deleted between the compare and the read: try again.
  }
  return absl::AbortedError("the key kept changing; try again");
}

absl::StatusOr<std::string> EtcdStore::SetIfAbsent(const std::string& key,
                                                   const std::string& value,
                                                   absl::Duration timeout) {
  const std::string what = absl::StrCat("set \"", key.substr(0, 128), "\"");
  if (absl::Status s = CheckKey(key); !s.ok()) return Named(s, what);
  if (absl::Status s = CheckValue(value); !s.ok()) return Named(s, what);
  absl::StatusOr<std::string> v = PutIfAbsent(key, value, lease_.load(), absl::Now() + timeout);
  if (!v.ok()) return Named(v.status(), what);
  return v;
}

absl::StatusOr<int64_t> EtcdStore::Add(const std::string& key, int64_t delta,
                                       absl::Duration timeout) {
  const std::string what = absl::StrCat("add \"", key.substr(0, 128), "\"");
  if (absl::Status s = CheckKey(key); !s.ok()) return Named(s, what);
  const absl::Time deadline = absl::Now() + timeout;
  const std::string k = EtcdKey(key);
  // Optimistic: read, then write only if nobody wrote in between.
  for (int attempt = 0; absl::Now() < deadline; ++attempt) {
    absl::StatusOr<etcd::RangeResult> r = etcd_->Range(k, "", Left(deadline));
    if (!r.ok()) return Named(r.status(), what);
    Compare unchanged = Compare::Unchanged(k, 0);
    if (!r->kvs.empty()) {
      unchanged = Compare::Unchanged(k, r->kvs.front().mod_revision);
    } else {
      bool appeared = false;
      if (absl::Status s = CheckRoomFor(k, deadline, &appeared); !s.ok()) return Named(s, what);
      if (appeared) continue;  // read it on the next pass
    }
    absl::StatusOr<int64_t> next =
        KvCounterSum(key, r->kvs.empty() ? nullptr : &r->kvs.front().value, delta);
    if (!next.ok()) return Named(next.status(), what);
    const int64_t sum = *next;
    absl::StatusOr<etcd::TxnResult> t =
        etcd_->Txn({unchanged}, {Op::Put(k, absl::StrCat(sum), lease_.load())}, {}, Left(deadline));
    if (!t.ok()) return Named(t.status(), what);
    if (t->succeeded) return sum;
  }
  return Named(absl::DeadlineExceededError("the counter kept changing until the deadline"), what);
}

absl::Status EtcdStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return WaitValues(keys, timeout).status();
}

absl::StatusOr<std::vector<std::string>> EtcdStore::WaitValues(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  if (absl::Status s = CheckKvKeyCount(limits_, keys.size(), "waiting for"); !s.ok()) {
    return Named(s, "wait");
  }
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return Named(s, "wait");
  }
  const Slot slot(&waiters_, limits_.max_waiters);
  if (!slot.ok()) return Named(KvWaitersFullError(limits_), "wait");
  const absl::Time deadline = CapKvDeadline(limits_, absl::Now() + timeout);
  std::map<std::string, std::string> found;  // etcd key -> value
  std::set<std::string> missing;
  for (const std::string& key : keys) missing.insert(EtcdKey(key));
  absl::Status last;
  while (!missing.empty()) {
    // Read what is missing, in transactions of at most kMaxTxnOps reads; the
    // first read's revision is where the watch starts, so nothing set after
    // it is missed.
    int64_t from = 0;
    std::vector<std::string> batch(missing.begin(), missing.end());
    bool failed = false;
    for (size_t i = 0; i < batch.size() && !failed; i += kMaxTxnOps) {
      std::vector<Op> gets;
      for (size_t j = i; j < std::min(batch.size(), i + kMaxTxnOps); ++j) {
        gets.push_back(Op::Get(batch[j]));
      }
      absl::StatusOr<etcd::TxnResult> t = etcd_->Txn({}, gets, {}, Left(deadline));
      if (!t.ok()) {
        last = t.status();
        failed = true;
        break;
      }
      if (from == 0) from = t->revision;
      for (const auto& range : t->ranges) {
        for (const etcd::KeyValue& kv : range) {
          found[kv.key] = kv.value;
          missing.erase(kv.key);
        }
      }
    }
    if (missing.empty()) break;
    if (!failed) {
      absl::StatusOr<std::unique_ptr<etcd::Watch>> watch =
          etcd_->StartWatch(kv_prefix_, etcd::PrefixEnd(kv_prefix_), from + 1, Left(deadline));
      if (!watch.ok()) {
        last = watch.status();
      } else {
        ++watching_;
        std::vector<etcd::WatchEvent> events;
        while (!missing.empty() && absl::Now() < deadline) {
          events.clear();
          last = (*watch)->Next(&events, deadline);
          for (const etcd::WatchEvent& e : events) {
            if (e.type != etcd::WatchEvent::Type::kPut || !missing.contains(e.kv.key)) continue;
            found[e.kv.key] = e.kv.value;
            missing.erase(e.kv.key);
          }
          if (!last.ok()) break;
        }
        (*watch)->Cancel();
        --watching_;
        if (missing.empty()) break;
      }
    }
    if (absl::Now() >= deadline) break;
    // etcd unreachable or the watch ended: read again shortly.
    absl::SleepFor(std::min(absl::Milliseconds(200), Left(deadline)));
  }
  if (!missing.empty()) {
    const std::string first = missing.begin()->substr(kv_prefix_.size());
    // A store that failed is named; one that answered ran out of time.
    if (last.ok()) {
      return Named(absl::DeadlineExceededError(absl::StrCat(
                       "timed out waiting for key \"", first.substr(0, 128), "\"",
                       missing.size() > 1 ? " and others" : "")),
                   "wait");
    }
    return Named(last, "wait");
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(found[EtcdKey(key)]);
  return values;
}

absl::Status EtcdStore::Delete(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (absl::Status s = CheckKvKeyCount(limits_, keys.size(), "deleting"); !s.ok()) {
    return Named(s, "delete");
  }
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return Named(s, "delete");
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < keys.size(); i += kMaxTxnOps) {
    std::vector<Op> deletes;
    for (size_t j = i; j < std::min(keys.size(), i + kMaxTxnOps); ++j) {
      deletes.push_back(Op::Delete(EtcdKey(keys[j])));
    }
    absl::StatusOr<etcd::TxnResult> t = etcd_->Txn({}, deletes, {}, Left(deadline));
    if (!t.ok()) return Named(t.status(), "delete");
  }
  return absl::OkStatus();
}

absl::Status EtcdStore::Barrier(const std::string& barrier, uint32_t count,
                                absl::Duration timeout) {
  const std::string what = absl::StrCat("barrier \"", barrier.substr(0, 128), "\"");
  if (absl::Status s = CheckBarrierCount(count); !s.ok()) return Named(s, what);
  const std::string base = absl::StrCat("hsdp/barrier/", barrier);
  if (absl::Status s = CheckKey(base + "/count"); !s.ok()) return Named(s, what);
  const Slot slot(&waiters_, limits_.max_waiters);
  if (!slot.ok()) return Named(KvWaitersFullError(limits_), what);
  const absl::Time deadline = CapKvDeadline(limits_, absl::Now() + timeout);
  // Every caller must agree on the count (the first one sets it).
  absl::StatusOr<std::string> agreed = PutIfAbsent(base + "/count", absl::StrCat(count), 0, deadline);
  if (!agreed.ok()) return Named(agreed.status(), what);
  if (*agreed != absl::StrCat(count)) {
    return Named(absl::InvalidArgumentError(absl::StrCat("count ", count, " disagrees with ",
                                                         agreed->substr(0, 16),
                                                         " of the callers already waiting")),
                 what);
  }
  // Arrive: the counter is unleased, so it outlives any one caller.
  const std::string k = EtcdKey(base + "/n");
  int64_t arrived = 0;
  for (;;) {
    if (absl::Now() >= deadline) {
      return Named(absl::DeadlineExceededError("timed out before arriving"), what);
    }
    absl::StatusOr<etcd::RangeResult> r = etcd_->Range(k, "", Left(deadline));
    if (!r.ok()) return Named(r.status(), what);
    absl::StatusOr<int64_t> next =
        KvCounterSum(base + "/n", r->kvs.empty() ? nullptr : &r->kvs.front().value, 1);
    if (!next.ok()) return Named(next.status(), what);
    const Compare unchanged = r->kvs.empty() ? Compare::Unchanged(k, 0)
                                             : Compare::Unchanged(k, r->kvs.front().mod_revision);
    absl::StatusOr<etcd::TxnResult> t =
        etcd_->Txn({unchanged}, {Op::Put(k, absl::StrCat(*next))}, {}, Left(deadline));
    if (!t.ok()) return Named(t.status(), what);
    if (t->succeeded) {
      arrived = *next;
      break;
    }
  }
  const int64_t end = ((arrived - 1) / count + 1) * static_cast<int64_t>(count);
  for (;;) {
    absl::StatusOr<etcd::RangeResult> r = etcd_->Range(k, "", Left(deadline));
    int64_t n = 0;
    if (r.ok() && !r->kvs.empty() && absl::SimpleAtoi(r->kvs.front().value, &n) && n >= end) {
      return absl::OkStatus();
    }
    if (r.ok() && absl::Now() < deadline) {
      absl::StatusOr<std::unique_ptr<etcd::Watch>> watch =
          etcd_->StartWatch(k, "", r->revision + 1, Left(deadline));
      if (watch.ok()) {
        std::vector<etcd::WatchEvent> events;
        bool done = false;
        while (!done && absl::Now() < deadline) {
          events.clear();
          const absl::Status s = (*watch)->Next(&events, deadline);
          for (const etcd::WatchEvent& e : events) {
            int64_t v = 0;
            done = done || (e.type == etcd::WatchEvent::Type::kPut &&
                            absl::SimpleAtoi(e.kv.value, &v) && v >= end);
          }
          if (!s.ok()) break;
        }
        (*watch)->Cancel();
        if (done) return absl::OkStatus();
      }
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(std::min(absl::Milliseconds(200), Left(deadline)));
  }
  // Leave: take this arrival back unless the generation completed meanwhile.
  const absl::Time leave_deadline = absl::Now() + absl::Seconds(2);
  for (int attempt = 0; attempt < 16 && absl::Now() < leave_deadline; ++attempt) {
    absl::StatusOr<etcd::RangeResult> r = etcd_->Range(k, "", Left(leave_deadline));
    if (!r.ok() || r->kvs.empty()) break;
    int64_t n = 0;
    if (!absl::SimpleAtoi(r->kvs.front().value, &n)) break;
    if (n >= end) return absl::OkStatus();
    absl::StatusOr<etcd::TxnResult> t =
        etcd_->Txn({Compare::Unchanged(k, r->kvs.front().mod_revision)}, {Op::Put(k, absl::StrCat(n - 1))},
                   {}, Left(leave_deadline));
    if (!t.ok() || t->succeeded) break;
  }
  return Named(absl::DeadlineExceededError("timed out before every caller arrived"), what);
}

}  // namespace hsdp
