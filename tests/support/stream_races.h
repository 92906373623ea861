#pragma once
// The fake device's stream race check (tensor/stream_order.h) as a test expectation.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/tensor/fake_device.h"

namespace shardwise {

// No access on one stream to memory another stream used without an event or host wait between:
// a race on a GPU (FakeDeviceMemory::stream_races).
inline void expect_no_stream_races(const FakeDeviceMemory& fake) {
  const std::vector<std::string> races = fake.stream_races();
  EXPECT_TRUE(races.empty()) << races.size() << " stream races:\n" << fmt::format("{}", fmt::join(races, "\n"));
}

}  // namespace shardwise
