// Descriptor validation: every untrusted field is checked and the error
// names it.
#include "daemon/dataplane/validate.h"

#include <cmath>
#include <limits>

#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using testing::AddBuffer;
using testing::MakeSession;

constexpr uint64_t kBufBytes = 4096;

shm::OpDescriptor Good(Collective c = Collective::kAllReduce) {
  shm::OpDescriptor d{};
  d.op_id = 1;
  d.seq = 1;
  d.collective = static_cast<uint8_t>(c);
  d.dtype = static_cast<uint8_t>(DataType::kFloat32);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  d.count = 16;
  d.premul_factor = d.pre_divide = d.post_divide = 1.0;
  d.group_id = 1;
  if (c == Collective::kReduceScatterAllReduce) d.group2_id = 2;
  return d;
}

void ExpectInvalid(const absl::Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(field)) << s;
}

TEST(ValidateFieldsTest, AcceptsWellFormedDescriptors) {
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                       Collective::kBroadcast, Collective::kBarrier,
                       Collective::kReduceScatterAllReduce}) {
    EXPECT_TRUE(ValidateFields(Good(c), shm::kFeaturesImplemented).ok()) << CollectiveName(c);
  }
  shm::OpDescriptor d = Good();
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kPremulSum);
  d.premul_factor = -0.5;  // negative premul factors are legal
  d.pre_divide = 2;
  d.post_divide = 3;
  d.reduce_dtype = static_cast<uint8_t>(DataType::kBFloat16);
  EXPECT_TRUE(ValidateFields(d, shm::kFeaturesImplemented).ok());
  d = Good();
  d.count = uint64_t{1} << 40;
  EXPECT_TRUE(ValidateFields(d, shm::kFeaturesImplemented).ok());
  // Barrier ignores every other field.
  shm::OpDescriptor b{};
  b.collective = static_cast<uint8_t>(Collective::kBarrier);
  b.dtype = 200;
  b.pre_divide = std::nan("");
  EXPECT_TRUE(ValidateFields(b, shm::kFeaturesImplemented).ok());
}

TEST(ValidateFieldsTest, Collective) {
  for (uint8_t v : {uint8_t{0}, uint8_t{kMaxCollective + 1}, uint8_t{255}}) {
    shm::OpDescriptor d = Good();
    d.collective = v;
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "collective");
  }
}

TEST(ValidateFieldsTest, Dtype) {
  for (uint8_t v : {uint8_t{0}, uint8_t{kMaxDataType + 1}, uint8_t{255}}) {
    shm::OpDescriptor d = Good(Collective::kAllGather);
    d.dtype = v;
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "dtype");
  }
}

TEST(ValidateFieldsTest, ReduceOp) {
  for (uint8_t v : {uint8_t{0}, uint8_t{kMaxReduceOp + 1}, uint8_t{255}}) {
    shm::OpDescriptor d = Good();
    d.reduce_op = v;
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "reduce_op");
    d.collective = static_cast<uint8_t>(Collective::kReduceScatter);
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "reduce_op");
  }
  // Non-reducing collectives ignore reduce_op.
  shm::OpDescriptor d = Good(Collective::kAllGather);
  d.reduce_op = 0;
  EXPECT_TRUE(ValidateFields(d, shm::kFeaturesImplemented).ok());
  // premul_sum on integers.
  d = Good();
  d.dtype = static_cast<uint8_t>(DataType::kInt32);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kPremulSum);
  ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "reduce_op");
}

TEST(ValidateFieldsTest, ReduceDtype) {
  shm::OpDescriptor d = Good();
  d.reduce_dtype = kMaxDataType + 1;
  ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "reduce_dtype");
  d.reduce_dtype = 255;
  ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "reduce_dtype");
  for (DataType t : {DataType::kInt32, DataType::kInt64, DataType::kUInt8}) {
    d.reduce_dtype = static_cast<uint8_t>(t);
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "reduce_dtype");
  }
  // Integer buffers reduce in their own type.
  d = Good();
  d.dtype = static_cast<uint8_t>(DataType::kInt64);
  d.reduce_dtype = static_cast<uint8_t>(DataType::kFloat32);
  ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "reduce_dtype");
}

TEST(ValidateFieldsTest, DivideFactors) {
  const double bad[] = {0.0, -0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity()};
  for (double v : bad) {
    shm::OpDescriptor d = Good();
    d.pre_divide = v;
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "pre_divide");
    d = Good(Collective::kReduceScatterAllReduce);
    d.post_divide = v;
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "post_divide");
  }
  for (double v : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    shm::OpDescriptor d = Good();
    d.premul_factor = v;
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "premul_factor");
  }
  // Integers take no divide factors.
  shm::OpDescriptor d = Good();
  d.dtype = static_cast<uint8_t>(DataType::kUInt8);
  d.post_divide = 2;
  ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "divide");
}

TEST(ValidateFieldsTest, Count) {
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast}) {
    shm::OpDescriptor d = Good(c);
    d.count = 0;  // empty tensors: matched, nothing moves
    EXPECT_TRUE(ValidateFields(d, shm::kFeaturesImplemented).ok()) << CollectiveName(c);
  }
  for (uint64_t v : {(uint64_t{1} << 40) + 1, ~uint64_t{0}}) {
    for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast}) {
      shm::OpDescriptor d = Good(c);
      d.count = v;
      ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "count");
    }
  }
}

TEST(ValidateFieldsTest, OffsetsKeepElementsAligned) {
  // An unaligned float load in the kernels is undefined behaviour (the
  // dispatcher fuzzer found one): offsets are multiples of the element size.
  auto with = [](DataType dt, uint64_t send_off, uint64_t recv_off) {
    shm::OpDescriptor d = Good();
    d.dtype = static_cast<uint8_t>(dt);
    d.send.offset_bytes = send_off;
    d.recv.offset_bytes = recv_off;
    return ValidateFields(d, shm::kFeaturesImplemented);
  };
  EXPECT_TRUE(with(DataType::kFloat32, 4096 + 8, 12).ok());
  ExpectInvalid(with(DataType::kFloat32, 0x4e, 0), "send.offset_bytes");
  ExpectInvalid(with(DataType::kFloat32, 0, 2), "recv.offset_bytes");
  ExpectInvalid(with(DataType::kFloat64, 4, 0), "send.offset_bytes");
  EXPECT_TRUE(with(DataType::kBFloat16, 2, 6).ok());
  EXPECT_TRUE(with(DataType::kUInt8, 3, 5).ok());
  shm::OpDescriptor a2a = Good();
  a2a.collective = static_cast<uint8_t>(Collective::kAllToAll);
  a2a.reduce_op = 0;
  a2a.splits = {7, 12};
  ExpectInvalid(ValidateFields(a2a, shm::kFeaturesImplemented), "splits.offset_bytes");
}

TEST(ValidateFieldsTest, ReservedFieldsAndUnknownFlagsAreRejected) {
  // So that later versions can give them meaning behind a feature bit.
  auto with = [](auto mutate) {
    shm::OpDescriptor d = Good();
    mutate(&d);
    return ValidateFields(d, shm::kFeaturesImplemented);
  };
  ExpectInvalid(with([](auto* d) { d->reserved0 = 1; }), "reserved0");
  ExpectInvalid(with([](auto* d) { d->reserved1[4] = 1; }), "reserved1");
  ExpectInvalid(with([](auto* d) { d->flags = 1u << 31; }), "flags");
  // A known flag whose feature was not negotiated.
  ExpectInvalid(with([](auto* d) { d->flags = shm::kFlagWaitEvent; }), "flags");
  ExpectInvalid(with([](auto* d) { d->event_id = 3; }), "event_id");
  ExpectInvalid(with([](auto* d) { d->peer = 1; }), "peer");
  ExpectInvalid(with([](auto* d) { d->tag = 5; }), "peer");
  ExpectInvalid(with([](auto* d) { d->splits.buffer_id = 2; }), "splits");
  ExpectInvalid(with([](auto* d) { d->seq2 = 4; }), "group2_id");
  // Send and recv: no sequence number, a peer, and only with the feature.
  shm::OpDescriptor p = Good();
  p.collective = static_cast<uint8_t>(Collective::kSend);
  p.seq = 0;
  p.peer = 1;
  EXPECT_TRUE(ValidateFields(p, shm::kFeaturesImplemented).ok());
  ExpectInvalid(ValidateFields(p, shm::kFeatureEpochs), "peer");
  p.seq = 3;
  ExpectInvalid(ValidateFields(p, shm::kFeaturesImplemented), "seq");
  p.seq = 0;
  p.peer = -1;  // any source is for receives only
  ExpectInvalid(ValidateFields(p, shm::kFeaturesImplemented), "peer");
  p.collective = static_cast<uint8_t>(Collective::kRecv);
  EXPECT_TRUE(ValidateFields(p, shm::kFeaturesImplemented).ok());
  // With the device-memory feature negotiated, the wait-event flag is accepted.
  shm::OpDescriptor d = Good();
  d.flags = shm::kFlagWaitEvent;
  d.event_id = 9;
  EXPECT_TRUE(ValidateFields(d, shm::kFeatureEpochs | shm::kFeatureDeviceMemory).ok());
}

TEST(ValidateFieldsTest, ClientAndDaemonShareTheReduceOptionRules) {
  // One definition (hsdp/shm/op_rules.h): the Python binding and the C++
  // client call CheckReduceOptions; the daemon reaches it through
  // CheckDescriptorFields. Divide factors must be finite and > 0.
  for (double bad : {0.0, -2.0, std::nan(""), double(INFINITY)}) {
    EXPECT_EQ(shm::CheckReduceOptions(DataType::kFloat32, ReduceOp::kSum, DataType::kInvalid, 1.0,
                                      bad, 1.0)
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
    shm::OpDescriptor d = Good();
    d.post_divide = bad;
    ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "post_divide");
  }
  EXPECT_TRUE(shm::CheckReduceOptions(DataType::kFloat32, ReduceOp::kPremulSum,
                                      DataType::kBFloat16, 0.0, 2.0, 4.0)
                  .ok());
  EXPECT_EQ(shm::CheckReduceOptions(DataType::kInt32, ReduceOp::kPremulSum, DataType::kInvalid,
                                    2.0, 1.0, 1.0)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateFieldsTest, CompositeNeedsReplicateGroup) {
  shm::OpDescriptor d = Good(Collective::kReduceScatterAllReduce);
  d.group2_id = 0;
  ExpectInvalid(ValidateFields(d, shm::kFeaturesImplemented), "group2_id");
}

class ResolveBuffersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    session_ = MakeSession(7, 0, 4);
    ASSERT_NE(session_, nullptr);
    a_ = AddBuffer(*session_, kBufBytes);
    b_ = AddBuffer(*session_, kBufBytes);
    ASSERT_NE(a_, 0u);
    ASSERT_NE(b_, 0u);
  }
  absl::Status Resolve(const shm::OpDescriptor& d, int rank = 0, int size = 4) {
    arrival_ = Arrival{};
    return ResolveBuffers(d, rank, size, *session_, nullptr, &arrival_);
  }
  shm::OpDescriptor Desc(Collective c, uint64_t count, uint64_t send_off, uint64_t recv_off,
                         bool same_buffer = false) {
    shm::OpDescriptor d = Good(c);
    d.count = count;
    d.send = {a_, send_off};
    d.recv = {same_buffer ? a_ : b_, recv_off};
    return d;
  }
  std::shared_ptr<Session> session_;
  uint64_t a_ = 0, b_ = 0;
  Arrival arrival_;
};

TEST_F(ResolveBuffersTest, ResolvesPointersAndKeepsMappingsAlive) {
  ASSERT_TRUE(Resolve(Desc(Collective::kAllReduce, 16, 64, 128)).ok());
  auto a = session_->FindBuffer(a_);
  auto b = session_->FindBuffer(b_);
  EXPECT_EQ(arrival_.send, a->data() + 64);
  EXPECT_EQ(arrival_.recv, b->data() + 128);
  EXPECT_EQ(arrival_.send_buf, a);
  EXPECT_EQ(arrival_.recv_buf, b);
}

// Device buffer ids (bit 62) on a daemon without a device engine, and a
// producer event on host buffers, are refused by name (the device path
// itself runs in tests/integration/device_*_test.cc against a real hsdpd).
TEST_F(ResolveBuffersTest, DeviceIdsNeedADeviceEngineAndEventsNeedDeviceBuffers) {
  shm::OpDescriptor d = Desc(Collective::kAllReduce, 16, 0, 0);
  d.send.buffer_id = shm::kDeviceBufferIdBit | 1;
  absl::Status s = Resolve(d);
  ExpectInvalid(s, "send.buffer_id");
  EXPECT_NE(s.message().find("no device engine"), std::string::npos) << s;
  d = Desc(Collective::kAllReduce, 16, 0, 0);
  d.flags = shm::kFlagWaitEvent;
  d.event_id = 1;
  ExpectInvalid(Resolve(d), "event_id");
  d = Good(Collective::kBarrier);
  d.flags = shm::kFlagWaitEvent;
  d.event_id = 1;
  ExpectInvalid(Resolve(d), "event_id");
}

TEST_F(ResolveBuffersTest, UnknownBufferId) {
  shm::OpDescriptor d = Desc(Collective::kAllReduce, 16, 0, 0);
  d.send.buffer_id = 99;
  ExpectInvalid(Resolve(d), "send.buffer_id");
  d = Desc(Collective::kAllReduce, 16, 0, 0);
  d.recv.buffer_id = 0;
  ExpectInvalid(Resolve(d), "recv.buffer_id");
  d.recv.buffer_id = ~uint64_t{0};
  ExpectInvalid(Resolve(d), "recv.buffer_id");
}

TEST_F(ResolveBuffersTest, RangesInsideTheBufferUpToTheLastByte) {
  // 1024 floats fill the buffer exactly.
  EXPECT_TRUE(Resolve(Desc(Collective::kAllReduce, 1024, 0, 0)).ok());
  EXPECT_TRUE(Resolve(Desc(Collective::kAllReduce, 1, kBufBytes - 4, kBufBytes - 4)).ok());
  // all-gather receives count * group size; reduce-scatter sends it.
  EXPECT_TRUE(Resolve(Desc(Collective::kAllGather, 256, 0, 0)).ok());
  EXPECT_TRUE(Resolve(Desc(Collective::kReduceScatter, 256, 0, 0)).ok());
}

TEST_F(ResolveBuffersTest, OffsetOrCountOutsideTheBuffer) {
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 1025, 0, 0)), "send.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 1, kBufBytes - 3, 0)), "send.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 1, 0, kBufBytes)), "recv.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 1, kBufBytes + 1, 0)), "send.offset_bytes");
  // The group size multiplies one side.
  ExpectInvalid(Resolve(Desc(Collective::kAllGather, 257, 0, 0)), "recv.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kReduceScatter, 257, 0, 0)), "send.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kReduceScatterAllReduce, 257, 0, 0)), "send.offset_bytes");
  // Overflow-style values: offset + bytes wraps around 2^64.
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 16, ~uint64_t{0} - 7, 0)), "send.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 16, 0, uint64_t{1} << 63)), "recv.offset_bytes");
  shm::OpDescriptor d = Desc(Collective::kAllGather, uint64_t{1} << 40, 0, 0);
  d.dtype = static_cast<uint8_t>(DataType::kFloat64);
  ExpectInvalid(Resolve(d, 0, 1 << 20), "offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kBroadcast, uint64_t{1} << 40, 8, 8)), "offset_bytes");
}

TEST_F(ResolveBuffersTest, LegalInPlaceLayouts) {
  // all-reduce / broadcast: the same range.
  EXPECT_TRUE(Resolve(Desc(Collective::kAllReduce, 16, 64, 64, true)).ok());
  EXPECT_EQ(arrival_.send, arrival_.recv);
  EXPECT_TRUE(Resolve(Desc(Collective::kBroadcast, 16, 0, 0, true)).ok());
  // all-gather: send is this rank's slice of recv.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(Resolve(Desc(Collective::kAllGather, 16, 256 + rank * 64, 256, true), rank).ok())
        << rank;
  }
  // reduce-scatter: recv is this rank's slice of send.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(Resolve(Desc(Collective::kReduceScatter, 16, 256, 256 + rank * 64, true), rank).ok())
        << rank;
    EXPECT_TRUE(
        Resolve(Desc(Collective::kReduceScatterAllReduce, 16, 0, rank * 64, true), rank).ok());
  }
  // Disjoint ranges in one buffer are fine.
  EXPECT_TRUE(Resolve(Desc(Collective::kAllReduce, 16, 0, 64, true)).ok());
}

TEST_F(ResolveBuffersTest, PartialOverlapIsRejected) {
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 16, 0, 4, true)), "recv.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 16, 60, 0, true)), "recv.offset_bytes");
  ExpectInvalid(Resolve(Desc(Collective::kBroadcast, 16, 8, 0, true)), "overlap");
  // all-gather in place at another rank's slot.
  ExpectInvalid(Resolve(Desc(Collective::kAllGather, 16, 64, 0, true), /*rank=*/2), "overlap");
  // reduce-scatter with the output at the wrong slice, or misaligned.
  ExpectInvalid(Resolve(Desc(Collective::kReduceScatter, 16, 0, 0, true), /*rank=*/1), "overlap");
  ExpectInvalid(Resolve(Desc(Collective::kReduceScatter, 16, 0, 66, true), /*rank=*/1), "overlap");
}

TEST_F(ResolveBuffersTest, BroadcastRoot) {
  for (int root : {-1, 4, 1 << 30}) {
    shm::OpDescriptor d = Desc(Collective::kBroadcast, 16, 0, 0);
    d.root = root;
    ExpectInvalid(Resolve(d), "root");
  }
  shm::OpDescriptor d = Desc(Collective::kBroadcast, 16, 0, 0);
  d.root = 3;
  EXPECT_TRUE(Resolve(d).ok());
}

TEST_F(ResolveBuffersTest, BarrierNeedsNoBuffers) {
  shm::OpDescriptor d{};
  d.collective = static_cast<uint8_t>(Collective::kBarrier);
  d.send.buffer_id = 12345;
  EXPECT_TRUE(Resolve(d).ok());
}

TEST_F(ResolveBuffersTest, FreedBufferIsUnknown) {
  ASSERT_TRUE(session_->RemoveBuffer(b_).ok());
  ExpectInvalid(Resolve(Desc(Collective::kAllReduce, 16, 0, 0)), "recv.buffer_id");
}

}  // namespace
}  // namespace hsdp
