#pragma once
// A `shardwise train` run in parts, shared by the command (cmd_train) and the Python package
// (python/src/train.cc): the options parsed from the command's words and completed as the command
// completes them, the checks before any rank starts, the ranks started (threads, or MPI processes
// under mpirun), and each rank's run step by step (RankRun). The command's loop and the package's
// shardwise.train / shardwise.Trainer drive the same code.
#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/cli/commands.h"
#include "shardwise/comm/communicator.h"
#include "shardwise/tensor/tensor.h"
#include "shardwise/train/metrics.h"

namespace shardwise::cli {

// After `cmd` parsed train's options into `o`: what sets them besides the words (apply_run_sources),
// the header's options line, the options the checkpoints keep, --save-on-interrupt's default, and
// the words themselves (for the resume command). app.cc's `train` and parse_train_args both call it.
void complete_train_options(CLI::App& cmd, TrainOptions& o, std::vector<std::string> command_line);

// `shardwise train ARGS...`'s options as the command resolves them. `resolved`: every option by
// long name (without "--"; --help and --config left out) with its value as text, a list option's as
// a list, after the --config file and a resumed checkpoint. Error of kind Usage (core/error.h)
// with the command's own message ("unknown option '--global-batchh' ... (did you mean
// '--global-batch'?)") for words it refuses.
struct ParsedTrain {
  TrainOptions options;
  nlohmann::json resolved;
};
ParsedTrain parse_train_args(const std::vector<std::string>& args);

// A run's options after the checks and defaults cmd_train applies before any rank starts.
struct PreparedRun {
  TrainOptions o;
  train::TrainConfig c;
  int64_t ranks = 1;
  bool mpi = false;  // launched by mpirun: one rank a process
};
// The checks (kind Usage; data files: Data) and defaults before a run, and its memory plan against
// --memory-limit (--dry-run prints it to `out`); sets the GEMM library and the kernel threads.
PreparedRun prepare_train_run(const TrainOptions& options, std::ostream& out);

// Runs `rank_fn` on every rank of the run: threads of this process (LocalWorld), or this process's
// rank under mpirun. `world` is the communicator the Trainer uses (a group of all ranks).
using RankFn = std::function<void(comm::Communicator& world_ref, std::shared_ptr<comm::Communicator> world)>;
void run_ranks(const PreparedRun& run, const RankFn& rank_fn);

// How a run ended, on rank 0.
struct TrainOutcome {
  std::string run_dir, save_dir;
  std::string newest_checkpoint;  // "" when the save directory holds none
  int64_t steps_done = 0;
};

// Error unless a run of `c` has an evaluation (the addition task's held-out accuracy), a validation
// set (--val-data, --val-fraction).
void check_evaluates(const train::TrainConfig& c);
void check_validates(const train::TrainConfig& c);

// One rank's part of a run. Every method is collective: all ranks call it together.
class RankRun {
 public:
  // Rank 0, after each step's line in metrics.jsonl: the step's record.
  using StepHook = std::function<void(const train::StepRecord&)>;
  // Builds the rank's Trainer, loads --init-from / --lora-from, chooses the run directory, resumes,
  // opens metrics.jsonl and prints the run header (rank 0).
  RankRun(const TrainOptions& o, const train::TrainConfig& c, comm::Communicator& world_ref,
          std::shared_ptr<comm::Communicator> world, std::ostream& out, StepHook on_step = {});
  ~RankRun();
  RankRun(const RankRun&) = delete;
  RankRun& operator=(const RankRun&) = delete;

  // Every step ran, the ranks agreed to stop on a signal (SIGINT, SIGTERM: cli/train/interrupt.h), or a
  // resumed run had nothing left to do.
  bool done() const;
  // One step as `shardwise train` runs it: the evaluation when due, the metrics line, a checkpoint
  // when due, the progress line; then whether a signal stops the run (saving the step with
  // --save-on-interrupt). Error when done().
  train::StepRecord step();
  // Whether any rank's process was asked to stop (a signal, or request_stop: cli/train/interrupt.h); if
  // so, saves this step with --save-on-interrupt (unless saved already) and the run is done. Nothing
  // when done(). step() calls it after every step but the last.
  bool stop_if_asked();
  double evaluate();  // the held-out exact-match accuracy (the addition task)
  double validate();  // the validation loss (--val-data, --val-fraction)
  // A Python model's outputs on `batch`, by name (train::StagedGpt::predict): those this rank's stages make.
  std::map<std::string, Tensor> predict(const std::map<std::string, Tensor>& batch);
  // A checkpoint of this step now, in the run's save directory; its directory ("" for an async save
  // until finish()).
  std::string save();
  // Waits for a background save, gathers --profile's events, prints the summary (rank 0).
  void finish();
  TrainOutcome outcome() const;
  const train::Trainer& trainer() const;
  const std::vector<train::StepRecord>& records() const;  // this run's steps (rank 0)

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// `shardwise train` (cmd_train) with a hook on rank 0 after each step's metrics line; `outcome`
// (when given) gets rank 0's TrainOutcome. Returns the exit status: 0, or 130 when a signal stopped
// the run (cli/train/interrupt.h).
int run_train(const TrainOptions& options, std::ostream& out, const RankRun::StepHook& on_step,
              TrainOutcome* outcome);

}  // namespace shardwise::cli
