// The NCCL engine on a real GPU (CudaDeviceApi + NcclCollectives; skips
// without one — label `gpu`, run by the GPU stage): several members of a
// collective on one GPU through hsdpd's intra-device kernels (every
// collective and reduce option of shared_device_cases.h, on 2, 4 and 10
// members of device 0), and one member per GPU on NCCL directly (a one-rank
// communicator on a one-GPU machine; every GPU when there are more). Never
// run here: this machine has no GPU.
#include <memory>
#include <string>
#include <vector>

#include "daemon/device/cuda_device_api.h"
#include "daemon/engine/nccl/nccl_collectives.h"
#include "daemon/engine/nccl/nccl_library.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/nccl/shared_device_cases.h"

namespace hsdp::nccl {
namespace {

using testing::Case;
using testing::EveryCase;
using testing::RunCase;

struct GpuNode {
  GpuNode(std::unique_ptr<device::CudaDeviceApi> api, const NcclLibrary* lib)
      : owned(std::move(api)), dev(*owned), coll(lib), engine(&dev, &coll) {}
  ~GpuNode() { engine.Shutdown(); }
  std::unique_ptr<device::CudaDeviceApi> owned;
  device::CudaDeviceApi& dev;
  NcclCollectives coll;
  NcclEngine engine;
};

std::unique_ptr<GpuNode> NodeOrSkip(std::string* reason) {
  auto api = device::CudaDeviceApi::Create();
  if (api->DeviceCount() == 0) {
    *reason = "no GPU on this machine (" + api->unavailable_reason() + ")";
    return nullptr;
  }
  auto lib = NcclLibrary::Default();
  if (!lib.ok()) {
    *reason = std::string(lib.status().message());
    return nullptr;
  }
  return std::make_unique<GpuNode>(std::move(api), *lib);
}

TEST(NcclSharedDeviceGpuTest, SeveralMembersOnOneGpuRunEveryCollective) {
  std::string reason;
  auto node = NodeOrSkip(&reason);
  if (node == nullptr) GTEST_SKIP() << reason;
  int k = 0;
  // Ten members: more than one launch of the reduce kernel (8 inputs each).
  for (const std::vector<int>& devs :
       {std::vector<int>{0, 0}, std::vector<int>{0, 0, 0, 0}, std::vector<int>(10, 0)}) {
    for (const Case& c : EveryCase()) RunCase(*node, devs, c, "g" + std::to_string(k++));
  }
  EXPECT_EQ(node->engine.stats().shared_device_tasks, uint64_t(k));
  EXPECT_EQ(node->engine.stats().tasks_failed, 0u);
}

TEST(NcclSharedDeviceGpuTest, OneMemberPerGpuRunsOnNccl) {
  std::string reason;
  auto node = NodeOrSkip(&reason);
  if (node == nullptr) GTEST_SKIP() << reason;
  std::vector<int> devs;
  for (int d = 0; d < node->dev.DeviceCount(); ++d) devs.push_back(d);
  int k = 0;
  for (const Case& c : EveryCase()) RunCase(*node, devs, c, "n" + std::to_string(k++));
  EXPECT_EQ(node->engine.stats().shared_device_tasks, 0u);
  EXPECT_GE(node->engine.stats().comm_inits, 1u);
}

}  // namespace
}  // namespace hsdp::nccl
