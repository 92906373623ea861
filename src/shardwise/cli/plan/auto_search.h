#pragma once
// The search behind `shardwise plan --auto` and `train --auto` (docs/planner.md): every candidate
// plan/search.h enumerates and its rules keep, refused again by train's own checks where they
// disagree, dropped when its peak memory per device is over the device's memory less the margin,
// the rest predicted and ranked by step time. Up to plan::kExactSearchDevices devices each
// candidate's stages are compiled (the memory plan and the program model); above, the analytic
// per-layer model (plan/analytic.h) stands in for both.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/plan/cluster.h"
#include "shardwise/plan/estimate.h"
#include "shardwise/plan/search.h"
#include "shardwise/train/train_config.h"

namespace shardwise::cli {

struct AutoOptions {
  int64_t devices = 0;         // 0: the cluster's (a calibration: its ranks)
  std::string cluster;         // a cluster description; "": this machine's calibration
  double memory_margin = 0.1;  // the share of a device's memory kept free
  int64_t max_micro_batch = 0;  // 0: every divisor of a data rank's share
  bool analytic = false;        // the analytic model whatever the devices
  bool mpi = false;             // this machine's ranks as MPI processes (calibration.mpi's collectives)
};

struct RankedCandidate {
  plan::Candidate candidate;
  plan::StepEstimate estimate;
};

struct AutoSearch {
  plan::ClusterSpec cluster;  // as searched (a calibration spread over `devices` ranks of one node)
  plan::SearchSpace space;
  plan::Enumeration enumeration;
  bool analytic = false;
  int64_t over_memory = 0, refused = 0;  // removed by the memory rule, by train's checks
  std::string first_refusal;             // train's message for the first candidate it refused
  std::vector<RankedCandidate> ranked;   // fastest first
  double seconds = 0;                    // the whole search
};

// `base`: the run's options (its model, --seq, --global-batch, --bf16; the mesh and batch split are
// the search's). Error naming the problem when nothing fits.
AutoSearch auto_search(const train::TrainConfig& base, const AutoOptions& o);

// `base` with the candidate's mesh, sequence parallelism, sharding stage, recompute, batch split and
// schedule (the gradient buckets reduced once a step, `on`, at stages 0-2), checked for `devices` ranks.
train::TrainConfig candidate_config(const train::TrainConfig& base, const plan::Candidate& c);

// `train --auto`: the fastest candidate for `ranks` devices of this machine's calibration, applied
// to `c` (the run's options, data defaults applied); the run header's line that names it. Error when
// `given` (the options given, by long name) holds an option the search chooses.
std::string choose_for_train(const nlohmann::json& given, train::TrainConfig& c, int64_t ranks);

// The analytic per-layer model's step and memory for a checked run (`plan --predict --analytic`):
// the candidate its mesh and options are. Error for what the analytic model cannot express (unequal
// stages, selective recompute, a mesh dim other than dp, tp, pp, ep).
plan::StepEstimate predict_analytic(const train::TrainConfig& tc, const plan::ClusterSpec& cluster);

// The `train` options that select the candidate: "--mesh dp=2,tp=2 --sharding-stage 1 ...".
std::string candidate_options(const plan::Candidate& c);

}  // namespace shardwise::cli
