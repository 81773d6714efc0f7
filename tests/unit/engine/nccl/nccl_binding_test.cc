// The NCCL binding without a GPU (CUDA builds): libnccl is loaded at run
// time (NcclLibrary), never linked; what it finds, and what it says when a
// file is missing or is not NCCL.
#include <dlfcn.h>
#include <stdlib.h>

#include <string>

#include "daemon/engine/nccl/nccl_collectives.h"
#include "daemon/engine/nccl/nccl_library.h"
#include "gtest/gtest.h"

namespace hsdp::nccl {
namespace {

TEST(NcclLibraryTest, TheDefaultLibraryHasEveryEntryPointAndShrinkFromNccl227) {
  auto lib = NcclLibrary::Default();
  ASSERT_TRUE(lib.ok()) << lib.status();  // this build found NCCL at configure time
  int version = 0;
  ASSERT_EQ((*lib)->GetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, (*lib)->version);
  EXPECT_GE(version, 21400);
  EXPECT_NE((*lib)->path.find("libnccl"), std::string::npos) << (*lib)->path;
  NcclCollectives coll(*lib);
  EXPECT_EQ(coll.name(), "nccl-" + std::to_string(version));
  // 2.27 and later have ncclCommShrink; the lookup must find it there.
  EXPECT_EQ(coll.SupportsShrink(), version >= 22700) << version;
  // The process did not get NCCL from its own link map: it was dlopen'ed.
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "ncclAllReduce"), nullptr);
}

TEST(NcclLibraryTest, AMissingFileIsNamedInTheError) {
  auto lib = NcclLibrary::Open("/nonexistent/libnccl.so.2");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(lib.status().message().find("/nonexistent/libnccl.so.2"), std::string::npos)
      << lib.status();
}

TEST(NcclLibraryTest, ALibraryThatIsNotNcclNamesTheFirstMissingEntryPoint) {
  auto lib = NcclLibrary::Open("libz.so.1");  // loads, but has no NCCL function
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lib.status().message().find("has no ncclGetVersion"), std::string::npos)
      << lib.status();
  EXPECT_NE(lib.status().message().find("libz.so.1"), std::string::npos) << lib.status();
}

}  // namespace
}  // namespace hsdp::nccl
