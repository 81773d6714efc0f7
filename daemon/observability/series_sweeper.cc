#include "daemon/observability/series_sweeper.h"

#include <utility>

namespace hsdp {

SeriesSweeper::SeriesSweeper(std::function<void()> sweep, absl::Duration min_interval)
    : sweep_(std::move(sweep)), min_interval_(min_interval) {}

SeriesSweeper::~SeriesSweeper() { Stop(); }

void SeriesSweeper::Start() { thread_ = std::thread([this] { Loop(); }); }

void SeriesSweeper::Want() {
  absl::MutexLock l(&mu_);
  wanted_ = true;
}

void SeriesSweeper::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void SeriesSweeper::Loop() {
  absl::MutexLock l(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(this, &SeriesSweeper::WantedOrStopped));
    if (stop_) return;
    wanted_ = false;
    mu_.Unlock();
    sweep_();
    mu_.Lock();
    mu_.AwaitWithTimeout(absl::Condition(&stop_), min_interval_);
  }
}

}  // namespace hsdp
