#include "daemon/cluster/kv_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hsdp {

KvStore::KvStore(KvLimits limits) : limits_(limits) {
  timer_ = std::thread([this] { TimerLoop(); });
}

KvStore::~KvStore() { Shutdown(); }

void KvStore::Run(std::vector<Completion>& completions) {
  for (auto& [done, status] : completions) done(status);
  completions.clear();
}

absl::Status KvStore::CheckKey(const std::string& key) const { return CheckKvKey(limits_, key); }

absl::Time KvStore::CapDeadline(absl::Time deadline) const {
  return CapKvDeadline(limits_, deadline);
}

absl::Status KvStore::Store(const std::string& key, std::string value,
                            std::vector<Completion>* out) {
  if (absl::Status s = CheckKvValue(limits_, value); !s.ok()) return s;
  auto it = values_.find(key);
  const size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (it == values_.end() && values_.size() >= limits_.max_keys) return KvKeysFullError(limits_);
  if (total_bytes_ - old_bytes + new_bytes > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the key/value store is full (", limits_.max_total_bytes, " bytes of keys and values)"));
  }
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  if (it == values_.end()) {
    values_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  // Wake waiters whose last missing key this was.
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    if (!w->barrier.empty()) {
      ++w;
      continue;
    }
    std::erase_if(w->keys, [&](const std::string& k) { return k == key; });
    if (w->keys.empty()) {
      out->emplace_back(std::move(w->done), absl::OkStatus());
      w = waiters_.erase(w);
    } else {
      ++w;
    }
  }
  return absl::OkStatus();
}

absl::Status KvStore::Set(const std::string& key, std::string value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::vector<Completion> completions;
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    status = Store(key, std::move(value), &completions);
  }
  Run(completions);
  return status;
}

absl::StatusOr<std::string> KvStore::SetIfAbsent(const std::string& key, std::string value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::vector<Completion> completions;
  {
    absl::MutexLock l(&mu_);
    if (auto it = values_.find(key); it != values_.end()) return it->second;
    if (absl::Status s = Store(key, value, &completions); !s.ok()) return s;
  }
  Run(completions);
  return value;
}

absl::Status KvStore::Delete(const std::vector<std::string>& keys) {
  if (absl::Status s = CheckKvKeyCount(limits_, keys.size(), "deleting"); !s.ok()) return s;
  for (const std::string& k : keys) {
    if (absl::Status s = CheckKey(k); !s.ok()) return s;
  }
  absl::MutexLock l(&mu_);
  for (const std::string& k : keys) {
    auto it = values_.find(k);
    if (it == values_.end()) continue;
    total_bytes_ -= k.size() + it->second.size();
    values_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::Get(const std::string& key) const {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("no key \"", key, "\""));
  return it->second;
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::vector<Completion> completions;
  int64_t sum = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = values_.find(key);
    absl::StatusOr<int64_t> next =
        KvCounterSum(key, it == values_.end() ? nullptr : &it->second, delta);
    if (!next.ok()) return next.status();
    sum = *next;
    if (absl::Status s = Store(key, absl::StrCat(sum), &completions); !s.ok()) return s;
  }
  Run(completions);
  return sum;
}

void KvStore::Wait(const std::vector<std::string>& keys, absl::Time deadline, Done done) {
  if (absl::Status s = CheckKvKeyCount(limits_, keys.size(), "waiting for"); !s.ok()) {
    done(s);
    return;
  }
  for (const std::string& k : keys) {
    if (absl::Status s = CheckKey(k); !s.ok()) {
      done(s);
      return;
    }
  }
  {
    absl::ReleasableMutexLock l(&mu_);
    if (stopping_) {
      l.Release();
      done(absl::UnavailableError("the coordinator is shutting down"));
      return;
    }
    std::vector<std::string> missing;
    for (const std::string& k : keys) {
      if (!values_.contains(k)) missing.push_back(k);
    }
    if (!missing.empty()) {
      if (waiters_.size() >= limits_.max_waiters) {
        l.Release();
        done(KvWaitersFullError(limits_));
        return;
      }
      waiters_.push_back(
          Waiter{next_id_++, std::move(missing), "", CapDeadline(deadline), std::move(done)});
      return;
    }
  }
  done(absl::OkStatus());
}

void KvStore::Barrier(const std::string& name, uint32_t count, absl::Time deadline, Done done) {
  if (absl::Status s = CheckKey(name); !s.ok()) {
    done(s);
    return;
  }
  if (absl::Status s = CheckBarrierCount(count); !s.ok()) {
    done(s);
    return;
  }
  std::vector<Completion> completions;
  {
    absl::ReleasableMutexLock l(&mu_);
    if (stopping_) {
      l.Release();
      done(absl::UnavailableError("the coordinator is shutting down"));
      return;
    }
    BarrierState& b = barriers_[name];
    if (!b.waiting.empty() && b.count != count) {
      const uint32_t expected = b.count;
      l.Release();
      done(absl::InvalidArgumentError(absl::StrCat("barrier \"", name, "\" has count ", expected,
                                                   "; this caller said ", count)));
      return;
    }
    b.count = count;
    if (b.waiting.size() + 1 >= count) {
      // The last arrival: release everyone.
      for (auto w = waiters_.begin(); w != waiters_.end();) {
        if (w->barrier == name) {
          completions.emplace_back(std::move(w->done), absl::OkStatus());
          w = waiters_.erase(w);
        } else {
          ++w;
        }
      }
      barriers_.erase(name);
      completions.emplace_back(std::move(done), absl::OkStatus());
    } else if (waiters_.size() >= limits_.max_waiters) {
      if (b.waiting.empty()) barriers_.erase(name);
      l.Release();
      done(KvWaitersFullError(limits_));
      return;
    } else {
      const uint64_t id = next_id_++;
      b.waiting.push_back(id);
      waiters_.push_back(Waiter{id, {}, name, CapDeadline(deadline), std::move(done)});
    }
  }
  Run(completions);
}

void KvStore::TimerLoop() {
  std::vector<Completion> completions;
  absl::MutexLock l(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Milliseconds(100);
    for (auto w = waiters_.begin(); w != waiters_.end();) {
      if (w->deadline > now) {
        next = std::min(next, w->deadline);
        ++w;
        continue;
      }
      if (!w->barrier.empty()) {
        auto b = barriers_.find(w->barrier);
        if (b != barriers_.end()) {
          std::erase(b->second.waiting, w->id);
          if (b->second.waiting.empty()) barriers_.erase(b);
        }
        completions.emplace_back(
            std::move(w->done),
            absl::DeadlineExceededError(absl::StrCat("barrier \"", w->barrier,
                                                     "\" timed out before every caller arrived")));
      } else {
        completions.emplace_back(
            std::move(w->done),
            absl::DeadlineExceededError(absl::StrCat("timed out waiting for key \"",
                                                     w->keys.front(), "\"",
                                                     w->keys.size() > 1 ? " and others" : "")));
      }
      w = waiters_.erase(w);
    }
    if (!completions.empty()) {
      mu_.Unlock();
      Run(completions);
      mu_.Lock();
      continue;
    }
    // Woken early only by shutdown; new waiters have deadlines >= now + a
    // little, and the 100 ms cap bounds how late an earlier one fires.
    mu_.AwaitWithDeadline(absl::Condition(&stopping_), next);
  }
}

void KvStore::Shutdown() {
  std::vector<Completion> completions;
  {
    absl::MutexLock l(&mu_);
    if (stopping_ && !timer_.joinable()) return;
    stopping_ = true;
    for (Waiter& w : waiters_) {
      completions.emplace_back(std::move(w.done),
                               absl::UnavailableError("the coordinator is shutting down"));
    }
    waiters_.clear();
    barriers_.clear();
  }
  if (timer_.joinable()) timer_.join();
  Run(completions);
}

size_t KvStore::key_count() const {
  absl::MutexLock l(&mu_);
  return values_.size();
}

size_t KvStore::waiter_count() const {
  absl::MutexLock l(&mu_);
  return waiters_.size();
}

}  // namespace hsdp
