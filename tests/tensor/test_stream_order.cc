// The race check of memory shared by streams (tensor/stream_order.h), by hand-written sequences
// against CUDA's ordering rules, and on the fake device (its copies, fills and host windows).
#include <gtest/gtest.h>

#include <string>

#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/fake_device.h"
#include "shardwise/tensor/stream_order.h"

namespace shardwise {
namespace {

void* const kA = reinterpret_cast<void*>(1);
void* const kB = reinterpret_cast<void*>(2);
constexpr uintptr_t kAt = 0x1000;

TEST(StreamOrder, WorkOnOneStreamIsOrdered) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "w1");
  o.access(kA, kAt, 64, false, "r1");
  o.access(kA, kAt, 64, true, "w2");
  EXPECT_TRUE(o.races().empty());
}

TEST(StreamOrder, AnotherStreamReadingAWriteWithNothingBetweenRaces) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "the write");
  o.access(kB, kAt + 32, 8, false, "the read");  // overlapping only part of it
  ASSERT_EQ(o.races().size(), 1u);
  EXPECT_NE(o.races()[0].find("the read on stream 0x2"), std::string::npos) << o.races()[0];
  EXPECT_NE(o.races()[0].find("races the write on stream 0x1"), std::string::npos) << o.races()[0];
}

TEST(StreamOrder, DisjointRangesDoNotRace) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "w");
  o.access(kB, kAt + 64, 64, true, "w");
  EXPECT_TRUE(o.races().empty());
}

TEST(StreamOrder, AnEventRecordedAfterTheWriteAndWaitedForOrdersTheRead) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "w");
  o.record(kA, 7);
  o.wait(kB, 7);
  o.access(kB, kAt, 64, false, "r");
  EXPECT_TRUE(o.races().empty());
}

TEST(StreamOrder, AnEventRecordedBeforeTheWriteDoesNot) {
  StreamOrder o;
  o.record(kA, 7);
  o.access(kA, kAt, 64, true, "w");
  o.wait(kB, 7);
  o.access(kB, kAt, 64, false, "r");
  EXPECT_EQ(o.races().size(), 1u);
}

TEST(StreamOrder, AHostWaitOrdersWhatIsQueuedAfterItOnAnyStream) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "w");
  o.synchronize(kA);
  o.access(kB, kAt, 64, true, "w again");
  EXPECT_TRUE(o.races().empty());
  o.access(kA, kAt, 64, false, "r");  // nothing orders B's write before it
  EXPECT_EQ(o.races().size(), 1u);
}

TEST(StreamOrder, AnEventTheHostSawDoneOrdersLikeAHostWait) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "w");
  o.record(kA, 3);
  o.event_seen(3);
  o.access(kB, kAt, 64, true, "w again");
  EXPECT_TRUE(o.races().empty());
}

TEST(StreamOrder, ReadsOnTwoStreamsDoNotRaceButAWriteAfterThemMustFollowBoth) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "w");
  o.synchronize(kA);
  o.access(kA, kAt, 64, false, "read on A");
  o.access(kB, kAt, 64, false, "read on B");
  EXPECT_TRUE(o.races().empty());
  o.record(kB, 1);
  o.wait(kA, 1);
  o.access(kA, kAt, 64, true, "write on A");  // after B's read (the event), after its own
  EXPECT_TRUE(o.races().empty());
  o.access(kB, kAt, 64, true, "write on B");  // nothing orders A's write before it
  ASSERT_EQ(o.races().size(), 1u);
  EXPECT_NE(o.races()[0].find("write on B on stream 0x2"), std::string::npos) << o.races()[0];
}

TEST(StreamOrder, FreedMemoryIsForgotten) {
  StreamOrder o;
  o.access(kA, kAt, 64, true, "w");
  o.forget(kAt, 64);
  o.access(kB, kAt, 64, true, "w");
  EXPECT_TRUE(o.races().empty());
}

// On the fake device: a zero fill on the default stream and a kernel's window on another stream,
// with no event between, is reported; with one, not.
TEST(StreamOrder, TheFakeDeviceReportsAFillAKernelOnAnotherStreamReads) {
  for (const bool with_event : {false, true}) {
    FakeDeviceMemory fake({.index = 0, .guard = false});
    void* p = fake.allocate(256);
    const Stream other = fake.create_stream();
    fake.fill_zero(p, 256, Stream{});
    if (with_event) fake.wait_event(other, fake.record_event(Stream{}));
    {
      StreamScope on_other(other);
      fake.open_for_host(p, 256, false);
      fake.close_for_host(p);
    }
    EXPECT_EQ(fake.stream_races().size(), with_event ? 0u : 1u) << with_event;
    if (!with_event) EXPECT_NE(fake.stream_races()[0].find("races a zero fill on stream default"), std::string::npos);
    fake.free(p);
  }
}

}  // namespace
}  // namespace shardwise
