// ProducerGate on its own, over the fake device: a task leaves once the
// producer events of its local members completed and its dependencies are
// neither held nor running, in launch order per group; a failed producer,
// a passed deadline and a late shutdown fail it without issuing anything;
// Remove takes one out.
#include "daemon/engine/nccl/producer_gate.h"

#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/device/fake_device_api.h"
#include "gtest/gtest.h"

namespace hsdp::nccl {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);

// A trainer's producer event: recorded on a stream held back by a host
// function until Open(), or (Fail()) behind one that fails.
class Producer {
 public:
  explicit Producer(device::FakeDeviceApi& dev, int device = 0) : dev_(dev) {
    stream_ = *dev_.CreateStream(device, device::StreamPriority::kDefault);
    auto opened = open_.get_future().share();
    EXPECT_TRUE(dev_.EnqueueHostFn(stream_, [opened] { return opened.get(); }).ok());
    event_ = *dev_.CreateEvent(device, true);
    EXPECT_TRUE(dev_.RecordEvent(event_, stream_).ok());
  }
  ~Producer() { Finish(absl::OkStatus()); }
  device::EventHandle event() const { return event_; }
  // The held work ends (with `result`); returns once the event is done.
  void Finish(absl::Status result) {
    if (finished_) return;
    finished_ = true;
    open_.set_value(std::move(result));
    dev_.SyncStream(stream_);
  }
  void Open() { Finish(absl::OkStatus()); }

 private:
  device::FakeDeviceApi& dev_;
  device::StreamHandle stream_ = 0;
  device::EventHandle event_ = 0;
  std::promise<absl::Status> open_;
  bool finished_ = false;
};

class ProducerGateTest : public ::testing::Test {
 protected:
  ProducerGateTest() : dev_(2), gate_(&dev_, kTimeout) {
    hooks_.running = [this](uint64_t t) { return running_.count(t) != 0; };
    hooks_.issue = [this](QueuedTask q) {
      issued_.push_back(q.ticket);
      running_.insert(q.ticket);
    };
    hooks_.fail = [this](QueuedTask q, absl::Status why) { failed_[q.ticket] = why; };
  }

  // A task of `group` with two local members; member 1 waits on `event`.
  QueuedTask Task(uint64_t ticket, const std::string& group, device::EventHandle event = 0,
                  std::vector<uint64_t> deps = {}) {
    QueuedTask q;
    q.ticket = ticket;
    q.task.collective = Collective::kAllReduce;
    q.task.group_key = group;
    q.task.depends_on = std::move(deps);
    for (int r = 0; r < 2; ++r) {
      EngineMember m;
      m.global_rank = r;
      q.task.members.push_back(m);
    }
    q.task.members[1].wait_event = event;
    q.deadline = now_ + kTimeout;
    return q;
  }
  void Release(bool late_stop = false) { gate_.Release(now_, late_stop, hooks_); }

  device::FakeDeviceApi dev_;
  ProducerGate gate_;
  ProducerGate::Hooks hooks_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::vector<uint64_t> issued_;
  std::set<uint64_t> running_;
  std::map<uint64_t, absl::Status> failed_;
};

TEST_F(ProducerGateTest, ATaskWithoutProducerEventsLeavesAtOnce) {
  gate_.Add(Task(1, "g"));
  EXPECT_TRUE(gate_.Holds(1));
  EXPECT_FALSE(gate_.empty());
  Release();
  EXPECT_EQ(issued_, std::vector<uint64_t>{1});
  EXPECT_TRUE(failed_.empty());
  EXPECT_FALSE(gate_.Holds(1));
  EXPECT_TRUE(gate_.empty());
  EXPECT_EQ(gate_.groups(), 0u);
}

TEST_F(ProducerGateTest, ATaskWaitsForItsProducerEvent) {
  Producer producer(dev_, 1);
  gate_.Add(Task(1, "g", producer.event()));
  Release();
  Release();
  EXPECT_TRUE(issued_.empty());
  EXPECT_TRUE(gate_.Holds(1));
  producer.Open();
  Release();
  EXPECT_EQ(issued_, std::vector<uint64_t>{1});
  EXPECT_TRUE(failed_.empty());
}

TEST_F(ProducerGateTest, AMemberOnAnotherNodeIsNotWaitedFor) {
  Producer producer(dev_);
  QueuedTask q = Task(1, "g", producer.event());
  q.task.members[1].local = false;  // its own daemon waits for its event
  gate_.Add(std::move(q));
  Release();
  EXPECT_EQ(issued_, std::vector<uint64_t>{1});
}

TEST_F(ProducerGateTest, LaunchOrderIsKeptPerGroupOnly) {
  Producer producer(dev_);
  gate_.Add(Task(1, "g", producer.event()));
  gate_.Add(Task(2, "g"));
  gate_.Add(Task(3, "h"));
  EXPECT_EQ(gate_.groups(), 2u);
  EXPECT_EQ(gate_.tasks(), 3u);
  Release();
  EXPECT_EQ(issued_, std::vector<uint64_t>{3});  // g's second waits behind its first
  EXPECT_TRUE(gate_.Holds(2));
  EXPECT_EQ(gate_.groups(), 1u);
  producer.Open();
  Release();
  EXPECT_EQ(issued_, (std::vector<uint64_t>{3, 1, 2}));
  EXPECT_TRUE(gate_.empty());
}

TEST_F(ProducerGateTest, ADependencyMustHaveLeftTheGateAndFinished) {
  Producer producer(dev_);
  gate_.Add(Task(1, "shard", producer.event()));
  gate_.Add(Task(2, "replicate", 0, {1}));
  Release();
  EXPECT_TRUE(issued_.empty()) << "the dependency is still held";
  producer.Open();
  Release();
  // "replicate" is released before "shard" in this pass, then the
  // dependency is issued and runs: the dependent still waits.
  EXPECT_EQ(issued_, std::vector<uint64_t>{1});
  Release();
  EXPECT_EQ(issued_, std::vector<uint64_t>{1});
  running_.erase(1);  // finished
  Release();
  EXPECT_EQ(issued_, (std::vector<uint64_t>{1, 2}));
}

TEST_F(ProducerGateTest, ADependencyIssuedEarlierInTheSamePassHoldsItsDependent) {
  gate_.Add(Task(1, "a"));
  gate_.Add(Task(2, "b", 0, {1}));
  Release();  // "a" first: task 1 is issued and running when task 2 is checked
  EXPECT_EQ(issued_, std::vector<uint64_t>{1});
  EXPECT_TRUE(gate_.Holds(2));
  running_.clear();
  Release();
  EXPECT_EQ(issued_, (std::vector<uint64_t>{1, 2}));
}

TEST_F(ProducerGateTest, AFailedProducerFailsItsTaskNamingTheRank) {
  Producer producer(dev_);
  gate_.Add(Task(1, "g", producer.event()));
  gate_.Add(Task(2, "g"));
  producer.Finish(absl::DataLossError("kernel fault"));
  Release();
  ASSERT_EQ(failed_.count(1), 1u);
  EXPECT_EQ(failed_[1].code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failed_[1].message().find("rank 1"), std::string::npos) << failed_[1];
  EXPECT_NE(failed_[1].message().find("kernel fault"), std::string::npos) << failed_[1];
  EXPECT_EQ(issued_, std::vector<uint64_t>{2}) << "the group's next task goes on";
}

TEST_F(ProducerGateTest, ATaskPastItsDeadlineFailsWithNothingIssued) {
  Producer producer(dev_);
  gate_.Add(Task(1, "g", producer.event()));
  gate_.Add(Task(2, "g"));
  now_ += kTimeout;  // at the deadline: still waits
  Release();
  EXPECT_TRUE(failed_.empty());
  now_ += absl::Milliseconds(1);
  Release();
  ASSERT_EQ(failed_.count(1), 1u);
  EXPECT_EQ(failed_[1].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(failed_[1].message().find("nothing was issued"), std::string::npos) << failed_[1];
  EXPECT_NE(failed_[1].message().find("all-reduce in group g"), std::string::npos) << failed_[1];
  EXPECT_EQ(issued_, std::vector<uint64_t>{2});
}

TEST_F(ProducerGateTest, AReadyTaskPastItsDeadlineIsStillIssued) {
  gate_.Add(Task(1, "g"));
  now_ += 2 * kTimeout;
  Release();
  EXPECT_EQ(issued_, std::vector<uint64_t>{1});
  EXPECT_TRUE(failed_.empty());
}

TEST_F(ProducerGateTest, AWaitingTaskFailsWhenTheShutdownIsLate) {
  Producer producer(dev_);
  gate_.Add(Task(1, "g", producer.event()));
  gate_.Add(Task(2, "h"));
  Release(/*late_stop=*/true);
  ASSERT_EQ(failed_.count(1), 1u);
  EXPECT_EQ(failed_[1].code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failed_[1].message().find("shutting down"), std::string::npos) << failed_[1];
  EXPECT_EQ(issued_, std::vector<uint64_t>{2}) << "a ready task is still issued";
  EXPECT_TRUE(gate_.empty());
}

TEST_F(ProducerGateTest, RemoveTakesOneTaskOut) {
  Producer producer(dev_);
  gate_.Add(Task(1, "g", producer.event()));
  gate_.Add(Task(2, "g"));
  EXPECT_FALSE(gate_.Remove(7).has_value());
  std::optional<QueuedTask> removed = gate_.Remove(1);
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->ticket, 1u);
  EXPECT_EQ(removed->task.group_key, "g");
  EXPECT_FALSE(gate_.Holds(1));
  EXPECT_FALSE(gate_.Remove(1).has_value());
  Release();
  EXPECT_EQ(issued_, std::vector<uint64_t>{2}) << "the group's next task is no longer held";
  EXPECT_TRUE(failed_.empty()) << "a removed task is its owner's to complete";
}

TEST_F(ProducerGateTest, RemovingTheLastTaskOfAGroupEmptiesTheGateAtTheNextRelease) {
  Producer producer(dev_);
  gate_.Add(Task(1, "g", producer.event()));
  ASSERT_TRUE(gate_.Remove(1).has_value());
  EXPECT_EQ(gate_.tasks(), 0u);
  Release();
  EXPECT_TRUE(gate_.empty());
  EXPECT_TRUE(issued_.empty());
}

}  // namespace
}  // namespace hsdp::nccl
