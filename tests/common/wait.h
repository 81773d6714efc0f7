// Waiting in tests: poll an observable condition until it holds or a
// deadline passes. The one place tests wait; a test never sleeps in place of
// a condition (a sleep is only the poll interval here).
#ifndef HSDP_TESTS_COMMON_WAIT_H_
#define HSDP_TESTS_COMMON_WAIT_H_

#include <chrono>
#include <functional>
#include <thread>
#include <utility>

namespace hsdp::testing {

// Polls `pred` every `poll_ms` for up to `timeout_ms`; true as soon as it
// holds. The last check is made at the deadline, so a slow machine that
// reaches the state just in time still passes.
inline bool Eventually(const std::function<bool()>& pred, int timeout_ms, int poll_ms = 20) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return pred();
}

// Polls `get()` until `ok(value)` holds or `timeout_ms` passes, and returns
// the last value read, so that a failed expectation shows what was seen:
//   EXPECT_EQ(EventuallyValue([&] { return View().state(); },
//                             [](auto& s) { return s == "ok"; }, 5000), "ok");
template <typename Get, typename Ok>
auto EventuallyValue(Get&& get, Ok&& ok, int timeout_ms, int poll_ms = 20) -> decltype(get()) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto value = get();
    if (ok(value) || std::chrono::steady_clock::now() >= deadline) return value;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
}

// Shorthand: polls `get()` until it equals `want`; returns the last value.
template <typename Get, typename T>
auto EventuallyEq(Get&& get, const T& want, int timeout_ms, int poll_ms = 20) -> decltype(get()) {
  return EventuallyValue(std::forward<Get>(get), [&](const auto& v) { return v == want; },
                         timeout_ms, poll_ms);
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_COMMON_WAIT_H_
