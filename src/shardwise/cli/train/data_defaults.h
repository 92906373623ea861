#pragma once
// `train --data`: what the run takes from its data when the options leave it out
// (train/data_defaults.h): the vocabulary without --vocab, and the step count without --steps (one
// epoch, or the budget of --epochs / --tokens).
#include <string>
#include <vector>

#include "shardwise/cli/commands.h"

namespace shardwise::cli {

// Sets `c`'s vocabulary and steps from the data as `o` asks; returns the header's lines saying what
// was chosen and why. Error for --epochs or --tokens without --data, with --steps, or not positive.
std::vector<std::string> apply_data_defaults(const TrainOptions& o, train::TrainConfig& c, int64_t ranks);

}  // namespace shardwise::cli
