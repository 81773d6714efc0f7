// Helpers for the NCCL engine tests: a fake node (FakeDeviceApi +
// FakeCollectives + NcclEngine), device buffers filled from host vectors,
// and a task runner that waits for completion with a bound (a hang fails
// the test instead of blocking ctest).
#ifndef HSDP_TESTS_UNIT_NCCL_ENGINE_TEST_UTIL_H_
#define HSDP_TESTS_UNIT_NCCL_ENGINE_TEST_UTIL_H_

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <memory>
#include <vector>

#include "daemon/device/fake_device_api.h"
#include "daemon/engine/nccl/fake_collectives.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "gtest/gtest.h"

namespace hsdp::nccl::testing {

struct Outcome {
  absl::Status status = absl::UnknownError("not completed");
  bool launched = false;
};

// A task in flight: `Wait` returns its outcome or fails the test after 10 s.
class Pending {
 public:
  Pending() : p_(std::make_shared<std::promise<Outcome>>()), f_(p_->get_future()) {}
  EngineCallbacks Callbacks() {
    auto launched = std::make_shared<bool>(false);
    auto p = p_;
    EngineCallbacks cb;
    cb.launched = [launched](uint64_t) { *launched = true; };
    cb.completed = [p, launched](absl::Status s, uint64_t) {
      p->set_value(Outcome{std::move(s), *launched});
    };
    return cb;
  }
  bool Ready(int ms = 0) {
    return f_.wait_for(std::chrono::milliseconds(ms)) == std::future_status::ready;
  }
  Outcome Wait() {
    if (f_.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "task did not complete within 10 s";
      return Outcome{};
    }
    return f_.get();
  }

 private:
  std::shared_ptr<std::promise<Outcome>> p_;
  std::future<Outcome> f_;
};

class FakeNode {
 public:
  explicit FakeNode(int devices, NcclEngineOptions options = FastOptions(),
                    bool shrink = true)
      : dev(devices), coll(&dev, shrink), engine(&dev, &coll, options) {}
  ~FakeNode() { engine.Shutdown(); }

  static NcclEngineOptions FastOptions() {
    NcclEngineOptions o;
    o.op_timeout = absl::Seconds(30);
    o.poll_interval = absl::Microseconds(200);
    return o;
  }

  template <typename T>
  device::DevicePtr Buffer(int d, const std::vector<T>& values) {
    auto p = dev.Allocate(d, values.size() * sizeof(T));
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(dev.CopyToDevice(*p, values.data(), values.size() * sizeof(T)).ok());
    return *p;
  }
  template <typename T>
  std::vector<T> Read(device::DevicePtr p, size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(dev.CopyToHost(out.data(), p, n * sizeof(T)).ok());
    return out;
  }

  device::FakeDeviceApi dev;
  FakeCollectives coll;
  NcclEngine engine;
};

inline BufferView DeviceView(int d, device::DevicePtr p, uint64_t bytes) {
  return BufferView{MemoryKind::kDevice, d, reinterpret_cast<void*>(p), bytes};
}

inline EngineMember Member(int rank, int d, device::DevicePtr send, device::DevicePtr recv,
                           uint64_t send_bytes, uint64_t recv_bytes) {
  EngineMember m;
  m.global_rank = rank;
  m.send = DeviceView(d, send, send_bytes);
  m.recv = DeviceView(d, recv, recv_bytes);
  return m;
}

// An n-member task on devices 0..n-1 with float buffers.
struct FloatTask {
  EngineTask task;
  std::vector<device::DevicePtr> send, recv;
};

inline FloatTask MakeTask(FakeNode& node, Collective c, int n, uint64_t count,
                   const std::function<float(int r, uint64_t i)>& value,
                   const std::string& group = "g", uint32_t epoch = 1) {
  FloatTask ft;
  ft.task.collective = c;
  ft.task.count = count;
  ft.task.group_key = group;
  ft.task.epoch = epoch;
  ft.task.spec.dtype = DataType::kFloat32;
  const auto ext = [&](bool send) -> uint64_t {
    if (c == Collective::kAllGather) return send ? count : count * n;
    if (c == Collective::kReduceScatter) return send ? count * n : count;
    if (c == Collective::kAllToAll) return count * n;
    return count;
  };
  for (int r = 0; r < n; ++r) {
    std::vector<float> in(ext(true));
    for (uint64_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
    ft.send.push_back(node.Buffer(r, in));
    ft.recv.push_back(node.Buffer(r, std::vector<float>(ext(false), -1.0f)));
    ft.task.members.push_back(Member(r, r, ft.send[r], ft.recv[r], ext(true) * 4, ext(false) * 4));
  }
  return ft;
}

}  // namespace hsdp::nccl::testing

#endif  // HSDP_TESTS_UNIT_NCCL_ENGINE_TEST_UTIL_H_
