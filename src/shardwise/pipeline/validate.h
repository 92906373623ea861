#pragma once
// The validator of a schedule. It checks, and throws a shardwise::Error naming the rank, the
// action and the rule on the first violation:
//   - every action belongs to its rank (stage on that rank, micro-batch in range, right peer), the
//     optimizer step comes once, last;
//   - each micro-batch passes each stage exactly once: one forward and one backward (or, for split
//     schedules, one input-gradient and one weight-gradient action);
//   - forward before backward, input gradient before weight gradient; a stage's input (from the
//     previous stage) and its output gradient (from the next) are there before they are used:
//     computed earlier on the same rank, or received earlier from the other rank; a send comes
//     after the action that computes what it sends;
//   - every send is matched by exactly one receive on the peer, and the other way round;
//   - no deadlock under blocking point-to-point (a send completes only when the peer posts the
//     matching receive), checked by simulating every rank's list.
#include "shardwise/pipeline/schedule.h"

namespace shardwise::pipeline {

void validate(const Schedule& schedule);

}  // namespace shardwise::pipeline
