#pragma once
// What a training run leaves in its run directory: metrics.jsonl (one JSON object per step, with
// the evaluation where one ran: "accuracy" for the addition task, "val_loss" and "val_ppl" =
// exp(val_loss) for a validation set; "loader_wait_s" and "loader_read_s" every step: StepResult's) and loss_curve.svg (the training loss by step, the
// validation loss beside it with a legend, accuracy on a second axis; a linear or log loss axis).
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

struct StepRecord {
  StepResult step;
  double elapsed_s = 0, tokens_per_s = 0;
  std::optional<double> accuracy;
  std::optional<double> val_loss;  // metrics.jsonl also gets val_ppl = exp(val_loss)
  std::string device;  // --device off the CPU ("cuda:0", "fake"); "" (not written) on the CPU
  // Off the CPU: the device allocator's peak bytes in use since the run started (this process's
  // ranks on the device together; as torch.cuda.max_memory_allocated), "device_peak_bytes".
  std::optional<int64_t> device_peak_bytes;
};

// A step's line of metrics.jsonl (without the newline).
nlohmann::json record_json(const StepRecord& r);

class MetricsLog {
 public:
  // Creates `run_dir` (and parents); Error when it cannot be written. A fresh run (`resumed_step`
  // < 0) starts an empty metrics.jsonl; a run resumed at `resumed_step` keeps the earlier lines up to
  // that step (the ones after it are trained again), drops the rest and appends.
  explicit MetricsLog(const std::string& run_dir, int64_t resumed_step = -1);
  void add(const StepRecord& r);  // appends a line to metrics.jsonl and flushes it
  const std::vector<StepRecord>& records() const { return records_; }  // this process's steps
  // Writes loss_curve.svg of the whole run (the kept earlier lines too); returns its path.
  std::string write_curve(const std::string& title, bool log_loss_axis = false) const;
  std::string jsonl_path() const { return dir_ + "/metrics.jsonl"; }
  // Where an earlier run's log in this directory was moved when this run started fresh ("" if none).
  const std::string& kept_aside() const { return kept_aside_; }

 private:
  std::string dir_, kept_aside_;
  std::ofstream out_;
  std::vector<StepRecord> earlier_, records_;
};

// The SVG text of a loss curve (validation losses and accuracy points, when given), for MetricsLog
// and tests. `log_loss_axis`: the loss axis is logarithmic (non-positive losses are not drawn).
// Both axes carry ticks at nice values (nice_ticks, log_ticks).
std::string loss_curve_svg(const std::vector<StepRecord>& records, const std::string& title, bool log_loss_axis = false);

// The curve's title: the model that ran and where, "shardwise: GPT-2, 2 layers, hidden 32 on [dp=2]";
// "Llama", or "Mixtral (8 experts, top-2)" for a Llama with experts.
std::string loss_curve_title(const GptConfig& model, const std::string& mesh);

// Tick values of a linear axis over [lo, hi]: the multiples in the range of the smallest step of
// 1, 2, 2.5 or 5 x 10^k that gives at most `most` of them (lo < hi).
std::vector<double> nice_ticks(double lo, double hi, int most = 6);
// Tick values of a logarithmic axis over [lo, hi] (0 < lo < hi): the decades 10^k in the range when
// it holds at least 3 of them, else 1, 2 and 5 x 10^k when at least 2 of those fall in it, else
// nice_ticks (a narrow range is nearly linear).
std::vector<double> log_ticks(double lo, double hi, int most = 6);

}  // namespace shardwise::train
