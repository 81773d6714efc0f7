// DefaultJobId: the job id a client derives when none is given — alike for
// every rank of one launch, different for two launches, refused when there
// is nothing to derive it from and more than one rank must agree.
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class DefaultJobIdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) ::unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
  }
  static constexpr const char* kVars[] = {"HSDP_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                                          "SLURM_STEP_ID", "PMIX_NAMESPACE"};
};

TEST_F(DefaultJobIdTest, TakesTheFirstLauncherIdInOrder) {
  ::setenv("PMIX_NAMESPACE", "ns7", 1);
  EXPECT_EQ(*DefaultJobId(4), "pmix-ns7");
  ::setenv("SLURM_JOB_ID", "123", 1);
  EXPECT_EQ(*DefaultJobId(4), "slurm-123");
  ::setenv("SLURM_STEP_ID", "2", 1);
  EXPECT_EQ(*DefaultJobId(4), "slurm-123.2") << "steps of one allocation are separate jobs";
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);
  EXPECT_EQ(*DefaultJobId(4), "slurm-123.2") << "torchrun's placeholder is not an id";
  ::setenv("TORCHELASTIC_RUN_ID", "run-9", 1);
  EXPECT_EQ(*DefaultJobId(4), "torchelastic-run-9");
  ::setenv("HSDP_JOB_ID", "mine", 1);
  EXPECT_EQ(*DefaultJobId(4), "mine");
}

TEST_F(DefaultJobIdTest, ASingleRankJobGetsAFreshIdAndAMultiRankJobIsRefused) {
  absl::StatusOr<std::string> a = DefaultJobId(1), b = DefaultJobId(1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_THAT(*a, StartsWith("solo-"));
  EXPECT_NE(*a, *b) << "two single-rank jobs of one process never share an id";
  absl::StatusOr<std::string> many = DefaultJobId(2);
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(many.status().message()),
              AllOf(HasSubstr("job_id: not set"), HasSubstr("$TORCHELASTIC_RUN_ID")));
  // Connect applies it before reaching any daemon.
  ClientOptions o;
  o.socket_path = "/nonexistent/hsdpd.sock";
  o.world_size = 2;
  o.connect_timeout = absl::Milliseconds(1);
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DefaultJobIdTest, AnIdOverTheDaemonsLimitIsRefused) {
  ::setenv("SLURM_JOB_ID", std::string(200, '7').c_str(), 1);
  absl::StatusOr<std::string> id = DefaultJobId(2);
  ASSERT_FALSE(id.ok());
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("$SLURM_JOB_ID"));
}

}  // namespace
}  // namespace hsdp
