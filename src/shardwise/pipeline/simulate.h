#pragma once
// The simulator of a schedule: each rank runs its list in order; a compute action takes its
// stage's time; a send takes `send_time` on the sender and the message arrives when it ends (the
// sender does not wait for the receiver); a receive waits for its message. From that:
//   step time  the time at which the last rank finishes its last action;
//   bubble     per rank, (step time - its compute time) / step time;
//   memory     per rank, the activation bytes held after each action: a forward adds its stage's
//              activation bytes (what backward needs of the micro-batch), a backward frees them; a
//              split schedule's input-gradient action keeps `weight_grad_bytes` until the weight
//              gradient. The peak is the largest sum, also counted in micro-batches in flight.
#include <cstdint>
#include <string>
#include <vector>

#include "shardwise/pipeline/schedule.h"

namespace shardwise::pipeline {

struct StageCosts {
  double forward = 1, backward = 2, backward_input = 1, backward_weight = 1;  // seconds (or any unit)
  int64_t activation_bytes = 1;   // held from the forward to the backward (or input-gradient) action
  int64_t weight_grad_bytes = 0;  // split schedules: held from the input gradient to the weight gradient
};

struct SimOptions {
  // One entry per stage, or one entry for every stage.
  std::vector<StageCosts> stages = {StageCosts{}};
  double send_time = 0;  // per message, on the sender
  // A replay: per rank, the duration of each action of its list (measured), instead of the stage
  // times; a receive's entry is its own time after the message has arrived. A message arrives
  // send_time after its send starts (or when the send ends, if sooner): a measured send may last
  // longer than the transfer (the sender descheduled once the message is out).
  std::vector<std::vector<double>> durations;
};

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct RankSim {
  std::vector<TimedAction> timeline;  // every action of the rank's list
  double compute = 0;                 // time in forward/backward actions
  double bubble_fraction = 0;         // (step time - compute) / step time
  int64_t peak_bytes = 0;
  int peak_micro_batches = 0;  // micro-batches in flight at the peak count (forward done, backward not)
};

struct SimResult {
  double step_time = 0;
  std::vector<RankSim> ranks;
  double max_bubble_fraction() const;
  int64_t max_peak_bytes() const;
  std::string summary() const;  // per rank: busy, idle, bubble, peak
};

SimResult simulate(const Schedule& schedule, const SimOptions& options = {});

// The timeline as an SVG picture: a row per rank, a box per compute action (forward blue,
// backward green, input gradient teal, weight gradient orange), labeled with its micro-batch.
std::string timeline_svg(const Schedule& schedule, const SimResult& result, const std::string& title = "");

}  // namespace shardwise::pipeline
