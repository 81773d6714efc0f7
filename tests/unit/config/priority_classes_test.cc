// The rules that put a job in a priority class (daemon/config/priority_classes.h):
// glob matching, first match wins, the implicit "default" class, and what a
// job may ask for at Attach.
#include "daemon/config/priority_classes.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(GlobMatchTest, StarsQuestionMarksAndLiterals) {
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("*", "anything"));
  EXPECT_TRUE(GlobMatch("infer-*", "infer-"));
  EXPECT_TRUE(GlobMatch("infer-*", "infer-llama-7b"));
  EXPECT_FALSE(GlobMatch("infer-*", "xinfer-1"));
  EXPECT_TRUE(GlobMatch("eval-?", "eval-3"));
  EXPECT_FALSE(GlobMatch("eval-?", "eval-"));
  EXPECT_FALSE(GlobMatch("eval-?", "eval-33"));
  EXPECT_TRUE(GlobMatch("*-ft-*", "llama-ft-run2"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(GlobMatch("exact", "exact"));
  EXPECT_FALSE(GlobMatch("exact", "exactly"));
  EXPECT_FALSE(GlobMatch("", "x"));
}

TEST(GlobMatchTest, AdversarialPatternsStayLinearish) {
  // 128-byte job names against a pattern of many stars: no exponential
  // backtracking (this would not finish otherwise).
  const std::string name(128, 'a');
  const std::string pattern = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b";
  EXPECT_FALSE(GlobMatch(pattern, name));
  EXPECT_TRUE(GlobMatch(pattern, name + "b"));
}

const std::vector<PriorityClass> kClasses = {
    {"interactive", 1, {"infer-*", "eval-?"}, {}},
    {"team-a", 2, {"*"}, {1000}},
    {"batch", 6, {}, {2000}},
    {"scavenger", 7, {"scav-*"}, {2000}},
};

TEST(ClassifyJobTest, FirstMatchWinsAndTheRestIsDefault) {
  EXPECT_EQ(ClassifyJob(kClasses, "infer-1", 2000).name, "interactive");  // before batch
  EXPECT_EQ(ClassifyJob(kClasses, "train", 1000).name, "team-a");
  EXPECT_EQ(ClassifyJob(kClasses, "scav-1", 2000).name, "batch");  // batch is listed first
  const ResolvedClass none = ClassifyJob(kClasses, "train", 3000);
  EXPECT_EQ(none.name, "default");
  EXPECT_EQ(none.level, 4u);
  EXPECT_EQ(ClassifyJob({}, "x", 0).level, kDefaultPriorityLevel);
}

TEST(ClassifyJobTest, ANamedDefaultClassSetsItsLevelAndMatchesOnlyItsRules) {
  const std::vector<PriorityClass> classes = {{"default", 5, {"never-*"}, {}}};
  const ResolvedClass c = ClassifyJob(classes, "train", 1000);
  EXPECT_EQ(c.name, "default");
  EXPECT_EQ(c.level, 5u);
}

TEST(ChooseJobClassTest, AJobMayGoLowerNeverHigher) {
  // Its own class by default, or when it names it.
  EXPECT_EQ(ChooseJobClass(kClasses, "train", 1000, "")->name, "team-a");
  EXPECT_EQ(ChooseJobClass(kClasses, "train", 1000, "team-a")->level, 2u);
  // Lower (a higher level): granted, the implicit default too.
  absl::StatusOr<ResolvedClass> c = ChooseJobClass(kClasses, "train", 1000, "batch");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->level, 6u);
  EXPECT_EQ(ChooseJobClass(kClasses, "train", 1000, "default")->level, 4u);
  // Higher: refused, naming both classes and levels.
  c = ChooseJobClass(kClasses, "train", 3000, "interactive");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(c.status().message()),
              AllOf(HasSubstr("\"default\" (level 4)"), HasSubstr("\"interactive\" is level 1")));
  // Unknown: refused, listing the classes that exist.
  c = ChooseJobClass(kClasses, "train", 1000, "gold");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              AllOf(HasSubstr("\"gold\""), HasSubstr("interactive, team-a, batch, scavenger, "
                                                     "default")));
}

TEST(ValidPriorityClassNameTest, Charset) {
  EXPECT_TRUE(ValidPriorityClassName("batch-2_x"));
  EXPECT_FALSE(ValidPriorityClassName(""));
  EXPECT_FALSE(ValidPriorityClassName("Batch"));
  EXPECT_FALSE(ValidPriorityClassName(std::string(33, 'a')));
  EXPECT_FALSE(ValidPriorityClassName("a b"));
}

}  // namespace
}  // namespace hsdp
