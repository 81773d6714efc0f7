#include "daemon/engine/crossnode/sidecar.h"

namespace hsdp {

Sidecar::Sidecar() : thread_([this] { Loop(); }) {}

Sidecar::~Sidecar() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Sidecar::Run(std::function<void()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  fn_ = std::move(fn);
  busy_ = true;
  cv_.notify_all();
}

bool Sidecar::Wait() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return !busy_; });
  const bool ok = !threw_;
  threw_ = false;
  return ok;
}

void Sidecar::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || fn_ != nullptr; });
    if (fn_ == nullptr) return;
    std::function<void()> fn = std::move(fn_);
    fn_ = nullptr;
    l.unlock();
    bool threw = false;
    try {
      fn();
    } catch (...) {
      threw = true;
    }
    l.lock();
    threw_ = threw;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace hsdp
