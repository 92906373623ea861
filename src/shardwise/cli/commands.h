#pragma once
// The shardwise subcommands; each writes to `out` and returns the exit code. Bad input throws
// shardwise::Error, which the caller prints as one line.
#include <CLI/CLI.hpp>
#include <functional>
#include <ostream>

#include "shardwise/train/trainer.h"
#include <string>
#include <vector>

namespace shardwise::train {
struct GenerateResult;  // generate/generate.h
}  // namespace shardwise::train

namespace shardwise::cli {

struct RulesOptions {
  bool list_ops = false;
};
int cmd_rules(const RulesOptions& options, std::ostream& out);

struct InferOptions {
  std::string op, mesh, shapes, placements, dtypes, attrs;
  std::string part = "forward";
};
int cmd_infer(const InferOptions& options, std::ostream& out);

struct VerifyCliOptions {
  std::vector<std::string> ops;
  std::vector<std::string> meshes;
  bool quiet = false;
  std::string device = "cpu";  // cli/device_option.h
};
int cmd_verify(const VerifyCliOptions& options, std::ostream& out);

struct PlanReshardOptions {
  std::string shape, from, to;
  std::string dtype = "f32";
  std::string strategy = "auto";
  double alpha_us = 5;
  double bandwidth_gbps = 10;
  std::vector<double> dim_bandwidth_gbps;
};
int cmd_plan_reshard(const PlanReshardOptions& options, std::ostream& out);

// `shardwise plan`'s own options; the run it plans is train's options (TrainOptions, declared below).
struct PlanOptions {
  std::vector<std::string> explain;
  bool summary = false;
  bool memory = false;  // the per-rank memory plan instead of the program
  bool check = false;   // with memory: exit 2 (an Error) when the plan does not fit --memory-limit
  bool symmetric = false;  // with memory: only the first rank of each pipeline rank (train::plan_memory)
  int kept = 0;  // with memory: the largest tensors a micro-batch keeps for its backward (0: none shown)
  bool predict = false;  // the predicted step time (plan/program_time.h) instead of the program
  std::string cluster;   // with predict or auto: a cluster description (plan/cluster.h); "": this machine's calibration
  bool analytic = false;     // with predict: the analytic per-layer model (plan/analytic.h) instead of the programs
  bool auto_search = false;  // search the candidates (cli/plan/auto_search.h) instead: train's --auto
  int64_t devices = 0;       // with auto: the devices to use (0: the cluster's)
  int64_t top = 5;           // with auto: candidates shown
  double memory_margin = 0.1;
  int64_t max_micro_batch = 0;
  // with predict or auto on this machine's calibration: the backend the run's ranks use, whose
  // collectives it is predicted with ("threads", "mpi"; "auto": mpi under mpirun, else threads)
  std::string backend = "auto";
};

// `shardwise pipeline`'s bounds: stages, micro-batches, and stages x virtual x micro-batches.
inline constexpr int kMaxPipelineStages = 1024, kMaxPipelineMicroBatches = 16384;
inline constexpr int64_t kMaxPipelineWork = 65536;
// `shardwise infer` lists every rank's local block: meshes of at most this many ranks.
inline constexpr int64_t kMaxInferRanks = 4096;

struct PipelineOptions {
  std::string schedule = "1f1b";
  int stages = 4;  // pipeline ranks (physical stages)
  int micro_batches = 8;
  int virtual_stages = 1;
  double forward_time = 1, backward_input_time = 1, backward_weight_time = 1, send_time = 0;
  int64_t activation_bytes = 1, weight_grad_bytes = 0;  // per micro-batch and stage (1: count micro-batches)
  std::string svg;
};
int cmd_pipeline(const PipelineOptions& options, std::ostream& out);

// [checkpoint]: where the run saves, and what it starts from.
struct CheckpointOptions {
  int64_t save_every = 0;  // 0: no checkpoints
  std::string save_dir;    // "": <run_dir>/checkpoints
  int64_t save_total_limit = 0;
  bool async_save = false;
  bool save_on_interrupt = false;  // SIGINT/SIGTERM save the step the run stops at (default: when saving)
  std::string max_shard_size = "5GB";
  std::string resume;      // "": start fresh; "auto": the newest verified checkpoint of save_dir; or a directory
  bool no_verify_resume = false;  // --resume DIR loads without checking its manifest
  bool save_model_only = false;   // checkpoints without optimizer state (moments, fp32 masters, generators)
  bool skip_optimizer = false;    // --resume: fresh AdamW moments at the saved step
  std::string init_from;   // a model directory (shardwise or transformers) whose weights start the run
  std::vector<std::string> ignore_keys;  // --init-from: globs of parameters or file keys not to load
  int64_t resize_vocab = 0;  // --init-from: grow the vocabulary to this many tokens (0: the tokenizer's, at least)
  std::string lora_from;   // a PEFT adapter directory whose adapters (and LoRA configuration) start the run
  bool operator==(const CheckpointOptions&) const = default;
};

// [logging]: what the run writes and shows.
struct LoggingOptions {
  std::string run_dir;  // "": the run that --resume continues, else a new runs/<config or model>-<time>
  int64_t eval_every = 500;  // 0: at the end only (accuracy of the addition task, or the validation loss)
  int64_t log_every = 0;   // 0: every steps/20 (or every step on a terminal)
  std::string progress = "auto";  // auto: a live bar on a terminal (not under mpirun), else lines; bar, lines, none
  std::string loss_axis = "log";  // loss_curve.svg: log (the usual choice for a loss) or linear
  bool profile = false;    // --profile: per-type times, collectives, allocator and page faults; <run_dir>/trace.json
  bool dry_run = false;    // print the memory plan and stop
  bool json = false;       // the plan as JSON
  bool operator==(const LoggingOptions&) const = default;
};

// `shardwise train`'s options in the sections of its --help and of a config file's tables: the
// Trainer's (config: [model], [parallel], [optimizer], [data]), [checkpoint] and [logging], and
// the few a section's options are turned into before the Trainer sees them: the ranks, the GEMM
// backend and the memory limit ([parallel]), --epochs and --tokens ([optimizer]: the steps).
struct TrainOptions {
  train::TrainConfig config;
  CheckpointOptions checkpoint;
  LoggingOptions logging;
  int64_t ranks = 0;  // 0: the mesh's size (threads), or mpirun's process count
  std::string gemm = "auto";  // --gemm: auto or a backend (cli/gemm_cmd.h)
  std::string device = "cpu";  // --device: cpu, cuda, cuda:N or fake (cli/train/train_device.h)
  std::string memory_limit = "auto";  // auto (MemAvailable), none, or a size: refuse a plan over it
  double epochs = 0;       // --epochs E: steps for E passes over the training tokens
  int64_t tokens = 0;      // --tokens N: steps for N training tokens
  std::string config_file;  // --config: a TOML file of long option names (the command line wins)
  bool auto_plan = false;   // --auto: the mesh and options plan --auto finds fastest here (cli/plan/auto_search.h)
  // Set by the command, not options:
  std::string gemm_line;      // the run header's line, set by cmd_train
  std::string device_name, device_line;  // metrics.jsonl's "device" and the header's line (none for cpu), set by cmd_train
  int kernel_threads = 1;     // threads of each rank's kernel pool (tensor/parallel.h), set by cmd_train
  std::string options_line;   // the run header's options that differ from the defaults (run_header.h), set by app.cc
  std::vector<std::string> command_line;  // the program and its arguments, for the resume command
  // --data runs (cli/train/data_defaults.h): the vocabulary and the steps come from the data unless given.
  bool vocab_given = true, steps_given = true;  // set by the command line (the option, --config, a checkpoint)
  nlohmann::json given;    // the options given (cli/train/stored_options.h): the checkpoints' run_options.json
  std::vector<std::string> data_notes;    // what the run took from its data (cli/train/data_defaults.h)
  std::string auto_line;  // --auto: the run header's line naming the chosen candidate
  std::vector<std::string> resume_notes;  // options a --resume took from its checkpoint, and the overrides
};
// --memory-limit's bytes: auto (the machine's available memory), none (0) or a size.
int64_t memory_limit_bytes(const std::string& text);
// `shardwise plan` of the run `train` describes: its program on the mesh (names as checkpoints
// have them: plan_names.h), with `plan.memory` its memory plan (plan --memory).
int cmd_plan(const TrainOptions& train, const PlanOptions& plan, std::ostream& out);
// `shardwise plan --memory` (and `train --dry-run`): the plan of the run `options` describe, as a
// table or JSON; over --memory-limit "does not fit" with its largest cause and the change that fixes
// it (train/memory_advice.h), then an Error (exit 2) only with `check`.
int cmd_plan_memory(const TrainOptions& options, const PlanOptions& plan, std::ostream& out);
// `shardwise plan --predict` (cli/plan/plan_predict.cc): the step time the model predicts for the run,
// on `cluster` (a file) or this machine's calibration, with its shares, tokens/s and MFU.
int cmd_plan_predict(const TrainOptions& options, const PlanOptions& plan, std::ostream& out);
// `plan --auto`: the search's top candidates (cli/plan/plan_auto.cc).
int cmd_plan_auto(const TrainOptions& options, const PlanOptions& plan, std::ostream& out);
// Plans a checked run (ranks as threads of one process, or one MPI rank a process), prints the plan
// when `print`, and with `refuse` refuses (Error) a plan over --memory-limit; `symmetric`: the first
// rank of each pipeline rank only (train::plan_memory).
void check_run_memory(const train::TrainConfig& config, const TrainOptions& options, bool threads, bool print,
                      std::ostream& out, bool refuse = true, bool symmetric = false, int kept = 0);
// --init-from: the model configuration comes from the directory's config.json; an option of `cmd`
// given on the command line or in --config that contradicts it is an Error naming both values.
void apply_init_from(CLI::App& cmd, TrainOptions& options);
// --lora-*: --lora-from takes the LoRA configuration from the adapter's adapter_config.json (an
// option that contradicts it is an Error naming both values); --lora-rank starts fresh adapters.
// Either needs --init-from (the base model); the other --lora-* options need one of them.
// `needs_base` false (`plan`): --lora-rank without --init-from plans adapters on a fresh base.
void apply_lora(CLI::App& cmd, TrainOptions& options, bool needs_base = true);
int cmd_train(const TrainOptions& options, std::ostream& out);

inline constexpr int64_t kEosFromModel = -2;      // --eos-id's default: generation_config.json's eos_token_id
inline constexpr double kTemperatureUnset = -1;  // --temperature's default: greedy, 1 with --top-k / --top-p

struct GenerateOptions {
  std::string gemm = "auto";  // --gemm: auto or a backend (cli/gemm_cmd.h)
  std::string gemm_line;      // what runs the GEMMs and why, set by cmd_generate
  int kernel_threads = 1;     // threads of each rank's kernel pool (tensor/parallel.h), set by cmd_generate
  std::string checkpoint;  // --checkpoint / --init-from: a checkpoint or model directory
  std::string config_file;
  std::vector<std::string> prompts;  // --prompt, repeatable (text: byte vocabularies)
  std::string prompt_file;           // one prompt per non-empty line (text)
  std::string prompt_ids;            // "1,2,3;4,5": prompts as token ids
  int64_t max_new_tokens = 32;
  double temperature = kTemperatureUnset;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  int64_t eos_id = kEosFromModel;  // -1: none
  std::string mesh = "dp=1";       // named dims dp, tp
  int64_t ranks = 0;               // 0: the mesh's size (threads), or mpirun's process count
  bool no_kv_cache = false;        // recompute the whole prefix for every token
  bool json = false;
  std::string logits_out;          // a .safetensors file: "logits.<i>" [new tokens, vocab] f32 per prompt
  std::string tokenizer;           // a SentencePiece model: text prompts encoded, output decoded
  bool keep_logits = false;        // each new token's logits in the result (run_generate)
  std::string device = "cpu";      // --device: cpu, fake or cuda (cli/device_option.h)
};
int cmd_generate(const GenerateOptions& options, std::ostream& out);
// The ranks of a run (train, generate): mpirun's process count under mpirun (Error when --ranks
// `given` says another), else `given`, else mesh_size() (0: the mesh's size).
int64_t count_ranks(int64_t given, const std::function<int64_t()>& mesh_size);
// cmd_generate handing rank 0's result to `result` (the Python package) instead of printing it.
int run_generate(const GenerateOptions& options, std::ostream& out, train::GenerateResult* result);

}  // namespace shardwise::cli
