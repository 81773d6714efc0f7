// Fuzz target: the coordinator's key/value store (KvStore) driven by a
// script of operations, against a model of what it must hold.
//
// Records (fuzz_input.h), payload [a: u8][b: u8][rest], key = "k" + (a % 12)
// unless the op says otherwise (so keys collide and limits are reached):
//   0 Set(key, rest)          1 SetIfAbsent(key, rest)   2 Get(key)
//   3 Delete(keys a..b)       4 Add(key, rest as int64)  5 Wait(keys a..b)
//   6 Barrier(key, count b%4) 7 Set with the whole rest as the key
//   8 Set(key, decimal text of rest as int64)
// Waits and barriers get a deadline 10 s away (a fuzz input never waits for
// one: Shutdown at the end completes them) or, when b is odd, one already
// past.
//
// Oracles: every result agrees with a model of the store under its limits
// (values, key count, total bytes, Add's arithmetic and overflow); a Wait
// whose keys all exist completes at once with OK; every Wait and Barrier
// callback runs exactly once by the end; nothing is left waiting after
// Shutdown.
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster/kv_store.h"
#include "fuzz_input.h"

namespace hsdp::fuzz {
namespace {

KvLimits SmallLimits() {
  KvLimits l;
  l.max_keys = 8;
  l.max_key_bytes = 24;
  l.max_value_bytes = 64;
  l.max_total_bytes = 256;
  l.max_waiters = 4;
  l.max_wait_keys = 4;
  l.max_wait = absl::Seconds(30);
  return l;
}

struct Model {
  KvLimits limits = SmallLimits();
  std::map<std::string, std::string> values;
  size_t Total() const {
    size_t t = 0;
    for (const auto& [k, v] : values) t += k.size() + v.size();
    return t;
  }
  bool KeyOk(const std::string& k) const { return !k.empty() && k.size() <= limits.max_key_bytes; }
  // Whether storing (k, v) fits the limits.
  bool Fits(const std::string& k, const std::string& v) const {
    if (v.size() > limits.max_value_bytes) return false;
    auto it = values.find(k);
    if (it == values.end() && values.size() >= limits.max_keys) return false;
    const size_t old = it == values.end() ? 0 : k.size() + it->second.size();
    return Total() - old + k.size() + v.size() <= limits.max_total_bytes;
  }
};

// Callbacks may run on the store's timer thread: fixed slots, no reallocation.
struct Calls {
  static constexpr size_t kMax = 256;
  std::array<std::atomic<int>, kMax> done{};
  std::mutex mu;
  std::array<absl::Status, kMax> status;
  size_t used = 0;
  KvStore::Done Make() {
    const size_t i = used++;
    return [this, i](absl::Status s) {
      {
        std::lock_guard<std::mutex> l(mu);
        status[i] = std::move(s);
      }
      done[i].fetch_add(1);
    };
  }
  absl::Status StatusOf(size_t i) {
    std::lock_guard<std::mutex> l(mu);
    return status[i];
  }
};

std::string Key(uint8_t a) { return absl::StrCat("k", a % 12); }

void CheckAgrees(const KvStore& kv, const Model& m, const std::string& key) {
  HSDP_FUZZ_CHECK(kv.key_count() == m.values.size(),
                  absl::StrCat(kv.key_count(), " keys, model ", m.values.size()));
  if (!m.KeyOk(key)) return;
  absl::StatusOr<std::string> v = kv.Get(key);
  auto it = m.values.find(key);
  if (it == m.values.end()) {
    HSDP_FUZZ_CHECK(absl::IsNotFound(v.status()), key + ": " + v.status().ToString());
  } else {
    HSDP_FUZZ_CHECK(v.ok() && *v == it->second, key + ": stored value differs from the model");
  }
}

}  // namespace
}  // namespace hsdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsdp;
  using namespace hsdp::fuzz;
  Model m;
  auto calls_ptr = std::make_unique<Calls>();
  Calls& calls = *calls_ptr;
  {
    KvStore kv(m.limits);
    Script script(data, size);
    Record r;
    int ops = 0;
    while (script.Next(&r) && ops++ < static_cast<int>(Calls::kMax)) {
      Fields f(r.payload);
      const uint8_t a = f.Get<uint8_t>(), b = f.Get<uint8_t>();
      const std::string rest(f.Rest());
      std::string key = Key(a);
      const absl::Time deadline = (b & 1) ? absl::Now() - absl::Seconds(1) : absl::Now() + absl::Seconds(10);
      switch (r.op % 9) {
        case 7:
          key = rest;
          [[fallthrough]];
        case 0: {
          const std::string value = r.op % 9 == 7 ? "v" : rest;
          const bool fits = m.KeyOk(key) && m.Fits(key, value);
          const absl::Status s = kv.Set(key, value);
          HSDP_FUZZ_CHECK(s.ok() == fits, absl::StrCat("Set(", key, "): ", s.ToString()));
          if (s.ok()) m.values[key] = value;
          break;
        }
        case 1: {
          const bool present = m.values.contains(key);
          absl::StatusOr<std::string> s = kv.SetIfAbsent(key, rest);
          if (present) {
            HSDP_FUZZ_CHECK(s.ok() && *s == m.values[key], "SetIfAbsent over a present key");
          } else {
            HSDP_FUZZ_CHECK(s.ok() == m.Fits(key, rest), s.status().ToString());
            if (s.ok()) {
              HSDP_FUZZ_CHECK(*s == rest, "SetIfAbsent returned another value");
              m.values[key] = rest;
            }
          }
          break;
        }
        case 2:
          break;  // CheckAgrees below is the Get
        case 3: {
          std::vector<std::string> keys;
          for (int i = a % 8; i <= b % 8 + a % 8 && i < 12; ++i) keys.push_back(Key(i));
          const absl::Status s = kv.Delete(keys);
          HSDP_FUZZ_CHECK(s.ok() == (keys.size() <= m.limits.max_wait_keys), s.ToString());
          if (s.ok()) {
            for (const auto& k : keys) m.values.erase(k);
          }
          break;
        }
        case 4:
        case 8: {
          int64_t delta = 0;
          std::memcpy(&delta, rest.data(), std::min(rest.size(), sizeof(delta)));
          if (r.op % 9 == 8) {
            const std::string value = absl::StrCat(delta);
            const bool fits = m.Fits(key, value);
            HSDP_FUZZ_CHECK(kv.Set(key, value).ok() == fits, "Set of a counter");
            if (fits) m.values[key] = value;
            break;
          }
          int64_t current = 0, sum = 0;
          auto it = m.values.find(key);
          const bool numeric = it == m.values.end() || absl::SimpleAtoi(it->second, &current);
          const bool overflow = numeric && __builtin_add_overflow(current, delta, &sum);
          const bool fits = numeric && !overflow && m.Fits(key, absl::StrCat(sum));
          absl::StatusOr<int64_t> s = kv.Add(key, delta);
          HSDP_FUZZ_CHECK(s.ok() == fits, absl::StrCat("Add(", key, ", ", delta, "): ",
                                                       s.status().ToString()));
          if (s.ok()) {
            HSDP_FUZZ_CHECK(*s == sum, "Add's sum");
            m.values[key] = absl::StrCat(sum);
          }
          break;
        }
        case 5: {
          std::vector<std::string> keys;
          for (int i = 0; i <= b % 6; ++i) keys.push_back(Key(a + i));
          bool all_present = keys.size() <= m.limits.max_wait_keys;
          for (const auto& k : keys) all_present = all_present && m.values.contains(k);
          const size_t i = calls.used;
          kv.Wait(keys, deadline, calls.Make());
          if (all_present) {
            HSDP_FUZZ_CHECK(calls.done[i] == 1 && calls.StatusOf(i).ok(),
                            "a Wait whose keys all exist did not complete at once");
          }
          if (keys.size() > m.limits.max_wait_keys) {
            HSDP_FUZZ_CHECK(calls.done[i] == 1 && absl::IsInvalidArgument(calls.StatusOf(i)),
                            "a Wait for too many keys was accepted");
          }
          break;
        }
        case 6:
          kv.Barrier(key, b % 4, deadline, calls.Make());
          break;
      }
      CheckAgrees(kv, m, key);
      HSDP_FUZZ_CHECK(kv.waiter_count() <= m.limits.max_waiters, "waiters beyond the limit");
    }
    kv.Shutdown();
    HSDP_FUZZ_CHECK(kv.waiter_count() == 0, "waiters left after Shutdown");
  }
  for (size_t i = 0; i < calls.used; ++i) {
    HSDP_FUZZ_CHECK(calls.done[i] == 1, absl::StrCat("callback ", i, " ran ", calls.done[i].load(),
                                                     " times"));
  }
  return 0;
}
