#pragma once
// When `train` prints a progress line off a terminal, and its warning about a long run.
#include <cstdint>
#include <ostream>
#include <string>

namespace shardwise::cli {

// Off a terminal (--progress lines, a pipe, mpirun) a line goes out after the run's first step
// (so a log shows at once that training runs), every `log_every` steps, at the last step, with an
// evaluation, and whenever kProgressMaxSilence seconds passed since the previous line.
inline constexpr double kProgressMaxSilence = 60;
struct ProgressLine {
  int64_t step = 0, first_step = 0, steps = 0, log_every = 1;
  bool evaluated = false;
  double since_last_s = 0;  // since the previous line (or the start)
};
bool progress_line_due(const ProgressLine& p);

// Once the first kEtaWarnAfterSteps steps of the run (or kEtaWarnAfterSeconds) have measured the
// speed: a warning when the remaining steps take over kEtaWarnSeconds; "" otherwise. The printer
// below says it once, at the first step where it holds.
inline constexpr int64_t kEtaWarnAfterSteps = 3;
inline constexpr double kEtaWarnAfterSeconds = 30, kEtaWarnSeconds = 3600;
struct EtaCheck {
  int64_t done = 0;       // steps this run has made
  int64_t remaining = 0;  // steps still to make
  double elapsed_s = 0;   // since the run's first step started
};
bool eta_measured(const EtaCheck& e);  // enough steps (or time) to judge
std::string eta_warning(const EtaCheck& e);

// Rank 0's progress output during the steps: a live bar (\r, erase to the end of the line; a line
// with an evaluation stays), plain lines when progress_line_due, or none; and eta_warning once
// (in every mode).
class ProgressPrinter {
 public:
  enum class Mode { Bar, Lines, None };
  ProgressPrinter(std::ostream& out, Mode mode, int64_t first_step, int64_t steps, int64_t log_every);
  // After step `step`: its progress line; `evaluated` when it evaluated; `elapsed_s` since the first step began.
  void step(const std::string& line, int64_t step, bool evaluated, double elapsed_s);
  bool bar_open() const { return bar_open_; }  // the bar's line has no newline yet
  bool bar() const { return mode_ == Mode::Bar; }

 private:
  std::ostream& out_;
  Mode mode_;
  int64_t first_step_, steps_, log_every_;
  bool bar_open_ = false, warned_ = false;
  double last_line_s_ = 0;  // when the last plain line went out
};

// "42s", "3m05s", "13h20m".
std::string duration_text(double seconds);

// A step's progress line: where the run is (a bar on a terminal; the step and the percentage done),
// the time since its first step, the time left at this run's speed, then `metrics` (loss, lr, ...).
//   bar:   "[########------------]  42%  step 126/300  elapsed 1m05s  ETA 1m30s  <metrics>"
//   lines: "step   126/300   42%  elapsed 1m05s  ETA 1m30s  <metrics>"
// The percentage is rounded down (100% only at the last step).
inline constexpr int kProgressBarWidth = 20;
struct StepProgress {
  int64_t step = 0, first_step = 0, steps = 0;  // first_step: the steps done when this run started
  double elapsed_s = 0;                         // since this run's first step began
  std::string metrics;
};
std::string progress_text(const StepProgress& p, bool bar);

}  // namespace shardwise::cli
