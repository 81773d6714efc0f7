// The NCCL binding without a GPU (CUDA builds): ncclCommShrink is found at
// run time in the libnccl this process loaded (NCCL 2.28 here), not linked.
#include "daemon/engine/nccl/nccl_collectives.h"

#include <nccl.h>

#include "gtest/gtest.h"

namespace hsdp::nccl {
namespace {

TEST(NcclBindingTest, ShrinkIsFoundAtRunTimeInTheLoadedNccl) {
  NcclCollectives coll;
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(coll.name(), "nccl-" + std::to_string(version));
  // 2.27 and later have ncclCommShrink; the lookup must find it there.
  EXPECT_EQ(coll.SupportsShrink(), version >= 22700) << version;
}

}  // namespace
}  // namespace hsdp::nccl
