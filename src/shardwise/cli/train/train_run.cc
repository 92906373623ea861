#include "shardwise/cli/train/train_run.h"

#include <cstdlib>
#include <iostream>
#include <sstream>

#include "shardwise/cli/train/data_defaults.h"
#include "shardwise/cli/gemm_cmd.h"
#include "shardwise/cli/plan/auto_search.h"
#include "shardwise/cli/train/run_header.h"
#include "shardwise/cli/train/stored_options.h"
#include "shardwise/cli/train/train_device.h"
#include "shardwise/cli/train/train_options.h"
#include "shardwise/cli/train/train_world.h"
#include "shardwise/cli/usage.h"
#include "shardwise/comm/local.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::cli {

int64_t count_ranks(int64_t given, const std::function<int64_t()>& mesh_size) {
  if (comm::launched_by_mpirun()) {
    const int64_t world = comm::mpi_world()->size();
    SW_CHECK(given == 0 || given == world, "--ranks {} but mpirun started {} processes", given, world);
    return world;
  }
  return given == 0 ? mesh_size() : given;
}

void complete_train_options(CLI::App& cmd, TrainOptions& o, std::vector<std::string> command_line) {
  apply_run_sources(cmd, o);
  o.options_line = given_options(cmd);
  o.given = stored_run_options(cmd);  // the checkpoints' run_options.json
  if (cmd.get_option("--save-on-interrupt")->count() == 0) o.checkpoint.save_on_interrupt = o.checkpoint.save_every > 0;
  o.command_line = std::move(command_line);
}

namespace {

// Every option of `cmd` by long name with its value: given (command line, --config, checkpoint) or
// its default; a list option's as a list.
nlohmann::json resolved_options(const CLI::App& cmd) {
  nlohmann::json out = nlohmann::json::object();
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string name = opt->get_lnames().front();
    if (name == "help" || name == "config") continue;
    const bool list = opt->get_expected_max() > 1 || opt->get_delimiter() != '\0';
    std::vector<std::string> values = opt->count() > 0 ? opt->results() : std::vector<std::string>{};
    if (opt->count() == 0 && !opt->get_default_str().empty()) {
      std::string d = opt->get_default_str();
      if (list && d.size() >= 2 && d.front() == '[' && d.back() == ']') d = d.substr(1, d.size() - 2);
      if (list) {
        std::istringstream items(d);
        for (std::string item; std::getline(items >> std::ws, item, ',');) values.push_back(item);
      } else {
        values.push_back(d);
      }
    }
    if (values.empty() && opt->get_expected_max() == 0) values.push_back("false");  // a flag not given
    if (list) {
      out[name] = values;
    } else {
      out[name] = values.empty() ? std::string() : values.back();
    }
  }
  return out;
}

}  // namespace

ParsedTrain parse_train_args(const std::vector<std::string>& args) {
  CLI::App app{"shardwise"};
  app.require_subcommand(1);
  ParsedTrain parsed;
  CLI::App* cmd = app.add_subcommand("train", "Train the GPT model on a mesh");
  cmd->option_defaults()->always_capture_default();
  add_train_options(*cmd, parsed.options);
  group_train_options(*cmd);
  refuse_out_of_range_integers(app);
  std::vector<std::string> words = {"shardwise", "train"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    std::ostringstream err;  // the command's one line, without its "shardwise: error: " and newline
    report_parse_error(app, e, static_cast<int>(argv.size()), argv.data(), err);
    std::string line = err.str();
    constexpr std::string_view kPrefix = "shardwise: error: ";
    if (line.rfind(kPrefix, 0) == 0) line.erase(0, kPrefix.size());
    while (!line.empty() && line.back() == '\n') line.pop_back();
    throw KindedError(ErrorKind::Usage, line);
  }
  raising(ErrorKind::Usage, [&] { complete_train_options(*cmd, parsed.options, words); });
  parsed.resolved = resolved_options(*cmd);
  // The flags whose value is not their option's text: --no-prefetch holds the prefetch it turns off,
  // and --save-on-interrupt's default follows --save-every.
  parsed.resolved["no-prefetch"] = parsed.options.config.data.loader_prefetch ? "false" : "true";
  parsed.resolved["save-on-interrupt"] = parsed.options.checkpoint.save_on_interrupt ? "true" : "false";
  return parsed;
}

PreparedRun prepare_train_run(const TrainOptions& options, std::ostream& out) {
  return raising(ErrorKind::Usage, [&]() -> PreparedRun {
    TrainOptions o = options;
    train::TrainConfig c = o.config;
    const bool mpi = comm::launched_by_mpirun();
    int64_t ranks = count_ranks(o.ranks, [&] { return mesh::parse_mesh(c.parallel.mesh).size(); });
    SW_CHECK(ranks >= 1, "--ranks must be at least 1, got {}", ranks);
    for (auto [name, value] : {std::pair{"--eval-every", o.logging.eval_every}, {"--log-every", o.logging.log_every},
                               {"--save-every", o.checkpoint.save_every}, {"--save-total-limit", o.checkpoint.save_total_limit}})
      SW_CHECK(value >= 0, "{} must be 0 or a positive number, got {}", name, value);
    // --data: the vocabulary and the steps from the data
    o.data_notes = raising(ErrorKind::Data, [&] { return apply_data_defaults(o, c, ranks); });
    if (o.logging.eval_every == 0) o.logging.eval_every = c.optimizer.steps;  // once, at the end
    SW_CHECK(!o.logging.json || o.logging.dry_run, "--json prints the memory plan of --dry-run (or `shardwise plan --memory --json`): "
             "add --dry-run");
    SW_CHECK(o.logging.progress == "auto" || o.logging.progress == "bar" || o.logging.progress == "lines" || o.logging.progress == "none",
             "--progress '{}': use auto, bar, lines or none", o.logging.progress);
    SW_CHECK(!o.checkpoint.skip_optimizer || !o.checkpoint.resume.empty(),
             "--skip-optimizer applies to --resume (fresh moments at the checkpoint's step); a run without --resume "
             "starts with fresh moments anyway");
    SW_CHECK(!o.checkpoint.save_model_only || o.checkpoint.save_every > 0 || o.checkpoint.save_on_interrupt,
             "--save-model-only: this run saves no checkpoints; add --save-every N (or --save-on-interrupt)");
    // Mixtral's router is a softmax over the experts and it has no shared expert: a sigmoid router or a
    // shared expert has no place in its config.json or keys.
    SW_CHECK(c.model.experts == 0 || (c.model.router == "softmax" && c.model.shared_expert_width == 0) ||
                 (o.checkpoint.save_every == 0 && o.checkpoint.resume.empty() && o.checkpoint.init_from.empty()),
             "--router {} --shared-expert-width {}: checkpoints of MoE models are Mixtral's layout, which has a softmax "
             "router and no shared expert: run without --save-every, --resume and --init-from, or with --router softmax "
             "and no --shared-expert-width", c.model.router, c.model.shared_expert_width);
    if (o.auto_plan) o.auto_line = choose_for_train(o.given, c, ranks);
    // --device: known, present and registered before the checks, which refuse what it cannot run.
    const SelectedDevice device = select_train_device(o.device, ranks, mpi);
    c.device = device.device, o.device_name = device.name, o.device_line = device.line;
    // Every check before anything starts. Under mpirun the data's are the Trainer's, on the processes
    // that read it (one that reads no batch never opens a data file); ranks as threads are one process.
    c.check(ranks, !mpi);
    // The memory plan against --memory-limit before anything is allocated; --dry-run prints it and stops
    // (under mpirun the first process prints).
    const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    check_run_memory(c, o, !mpi, o.logging.dry_run && (!mpi_rank || std::atoi(mpi_rank) == 0), out);
    if (o.logging.dry_run) return {o, c, ranks, mpi};
    o.gemm_line = choose_gemm(o.gemm);  // before any GEMM: fixes the library's core type
    set_blas_threads(mpi || ranks > 1 ? 1 : 0);
    // Each rank's kernels split their loops over as many threads as its GEMMs use (one per rank when
    // ranks share the machine, the GEMM library's count for one rank): the cores in use stay the same.
    o.kernel_threads = mpi || ranks > 1 ? 1 : blas_threads();
    return {o, c, ranks, mpi};
  });
}

void run_ranks(const PreparedRun& run, const RankFn& rank_fn) {
  // THE WORLD COMMUNICATOR is chosen here. MPI processes talk through MPI on host memory, staging a
  // fake device's buffers through the host; on GPUs the world routes device-buffer calls to NCCL and
  // host-buffer calls to MPI (train_world.h). Rank threads share one LocalWorld.
  if (run.mpi) {
    comm::run_mpi_main([&](comm::Communicator&) {
      std::shared_ptr<comm::Communicator> world = mpi_train_world(run);
      rank_fn(*world, world);
      report_routes(*world, std::cerr);
    });
  } else {
    comm::LocalWorld::run(static_cast<int>(run.ranks), [&](comm::Communicator& world) {
      auto self = world.group(world.members());
      rank_fn(world, self);
    });
  }
}

}  // namespace shardwise::cli
