#pragma once
// What a training run leaves in its run directory: metrics.jsonl (one JSON object per step, with
// the evaluation where one ran) and loss_curve.svg (the loss by step, accuracy on a second axis).
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

struct StepRecord {
  StepResult step;
  double elapsed_s = 0, tokens_per_s = 0;
  std::optional<double> accuracy;
};

class MetricsLog {
 public:
  // Creates `run_dir` (and parents); Error when it cannot be written. `append` keeps the lines of
  // an earlier run (a resumed one).
  explicit MetricsLog(const std::string& run_dir, bool append = false);
  void add(const StepRecord& r);  // appends a line to metrics.jsonl and flushes it
  const std::vector<StepRecord>& records() const { return records_; }
  // Writes loss_curve.svg; returns its path.
  std::string write_curve(const std::string& title) const;
  std::string jsonl_path() const { return dir_ + "/metrics.jsonl"; }

 private:
  std::string dir_;
  std::ofstream out_;
  std::vector<StepRecord> records_;
};

// The SVG text of a loss curve (and accuracy points, when given), for MetricsLog and tests.
std::string loss_curve_svg(const std::vector<StepRecord>& records, const std::string& title);

}  // namespace shardwise::train
