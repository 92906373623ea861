// Training from Python (python/shardwise/training.py wraps these): `shardwise train`'s options parsed
// by the command's own parser (cli/train/train_run.h), a whole run as the command runs it, and a run driven
// step by step. Ranks are threads of this process (or this process's rank under mpirun); the GIL is
// released while they run, and the interpreter's signal handlers run meanwhile (Ctrl-C).
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "arrays.h"
#include "errors.h"
#include "shardwise/cli/train/interrupt.h"
#include "graph.h"
#include "shardwise/cli/train/train_run.h"

namespace shardwise::py {
namespace {

using cli::RankRun;

// A Python callable called on rank 0's thread with a step's metrics line (JSON text). An exception
// it raises is kept (and stops the run through an Error on rank 0); the caller raises it again.
struct StepCallback {
  nb::object fn;
  std::optional<nb::python_error> raised;
  RankRun::StepHook hook() {
    if (!fn.is_valid() || fn.is_none()) return {};
    return [this](const train::StepRecord& r) {
      const std::string line = train::record_json(r).dump();
      nb::gil_scoped_acquire gil;
      try {
        fn(line);
      } catch (nb::python_error& e) {
        raised.emplace(std::move(e));
        fail("on_step raised an exception at step {}", r.step.step);
      }
    };
  }
};

// shardwise.train: the whole run; the outcome as JSON text with the exit status (130: a signal).
std::string train_run(const std::vector<std::string>& args, nb::object on_step) {
  const cli::ParsedTrain parsed = cli::parse_train_args(args);
  StepCallback callback{std::move(on_step), std::nullopt};
  cli::TrainOutcome outcome;
  int status = 0;
  try {
    nb::gil_scoped_release release;
    status = cli::run_train(parsed.options, std::cout, callback.hook(), &outcome);
  } catch (const Error&) {
    if (callback.raised) throw std::move(*callback.raised);
    throw;
  }
  nlohmann::json j = {{"status", status},
                      {"run_dir", outcome.run_dir},
                      {"save_dir", outcome.save_dir},
                      {"newest_checkpoint", outcome.newest_checkpoint},
                      {"steps_done", outcome.steps_done},
                      {"dry_run", parsed.options.logging.dry_run}};
  return j.dump();
}

// shardwise.Trainer: the ranks run on a thread of their own, each waiting for the caller's next
// command (a step, an evaluation, a save, the end); the caller waits for every rank to finish it.
// Ctrl-C while they run: the interpreter's handler raises KeyboardInterrupt (polled every
// kSignalPoll), which asks the ranks to stop after the command (cli::request_stop); they stop as
// `shardwise train` does, saving the step with --save-on-interrupt, and then the command raises it. A
// second one is raised at once: the ranks finish the command (and that save) on their own, and
// close() waits for them.
class StepwiseRun {
 public:
  enum class Op { Setup, Step, Evaluate, Validate, Predict, Save, Interrupt, Finish };
  static constexpr std::chrono::milliseconds kSignalPoll{20};

  // `model`: a Python model's builder (python_model), or None for the built-in model the options name.
  // `feeds`: the model's inputs step() is given batches of (none: the loader's token ids).
  StepwiseRun(const std::vector<std::string>& args, nb::handle model, const std::string& description,
              const std::string& model_config, const std::vector<std::string>& feeds)
      : parsed_(cli::parse_train_args(args)) {
    if (!model.is_none())
      parsed_.options.config.model.custom = python_model(model, description, model_config, feeds, fed_);
    start();
    wait(Op::Setup, false);
  }
  ~StepwiseRun() {
    try {
      close();
    } catch (...) {  // a destructor does not raise; close() did, when called
    }
  }

  // `batch`: the step's whole batch of each fed input (arrays read in place, alive during the step).
  std::string step(const std::map<std::string, AnyArray>& batch) {
    raising(ErrorKind::Usage, [&] {
      SW_CHECK(!done_, "the run has no step left: {} of {} steps done", outcome_.steps_done, run_.c.optimizer.steps);
      hand(batch);
    });
    stopping(Op::Step);
    return record_;
  }
  double evaluate() {
    raising(ErrorKind::Usage, [&] { cli::check_evaluates(run_.c); });
    stopping(Op::Evaluate);
    return value_;
  }
  // `batch`: for a fed model, the whole batch whose loss to give (as step's); else empty.
  double validate(const std::map<std::string, AnyArray>& batch) {
    raising(ErrorKind::Usage, [&] {
      cli::check_validates(run_.c);
      hand(batch);
    });
    stopping(Op::Validate);
    return value_;
  }
  // A Python model's outputs on `batch` (arrays read in place, alive during the call), by name: those
  // of every rank of this process (each output is whole on the ranks of the stage that makes it).
  nb::dict predict(const std::map<std::string, AnyArray>& batch) {
    raising(ErrorKind::Usage, [&] {
      predict_in_.clear(), predicted_.clear();
      for (const auto& [name, array] : batch) predict_in_[name] = tensor_from(array, name, "Trainer.predict");
    });
    stopping(Op::Predict);
    predict_in_.clear();
    nb::dict out;
    for (const auto& [name, t] : predicted_) out[name.c_str()] = array_from(t);
    predicted_.clear();
    return out;
  }
  std::string save() {
    stopping(Op::Save);
    return saved_;
  }
  // What Ctrl-C during a command does, now (the Trainer's `with` calls it on a KeyboardInterrupt
  // raised between steps): the ranks stop, saving this step with --save-on-interrupt; the summary
  // says interrupted. Nothing when the run is done, closed or abandoned to a second Ctrl-C.
  void interrupt() {
    if (done_ || closed_ || abandoned_ || failed()) return;
    cli::request_stop(SIGINT);
    stopping(Op::Interrupt);
  }
  // The summary (as `shardwise train` prints it at the end); the ranks end. Again: nothing.
  void close() {
    if (closed_) return;
    closed_ = true;
    if (abandoned_) wait(Op::Setup, false), abandoned_ = false;  // the command a second Ctrl-C left running
    if (!failed()) command(Op::Finish);
    cli::clear_stop();
    nb::gil_scoped_release release;
    if (runner_.joinable()) runner_.join();
  }
  bool done() const { return done_; }
  const std::vector<std::string>& records() const { return records_; }
  const cli::TrainOutcome& outcome() const { return outcome_; }
  const cli::ParsedTrain& parsed() const { return parsed_; }
  int ranks() const { return ranks_; }

 private:
  // The arrays the ranks bind for the next command (a fed model's batch), read in place.
  void hand(const std::map<std::string, AnyArray>& batch) {
    std::lock_guard lock(fed_->mu);
    fed_->tensors.clear();
    for (const auto& [name, array] : batch) fed_->tensors[name] = tensor_from(array, name, "Trainer.step / validate");
  }
  // The checks before a run (the GIL released), then the ranks on a thread of their own.
  void start() {
    cli::clear_stop();
    nb::gil_scoped_release release;
    run_ = cli::prepare_train_run(parsed_.options, std::cout);
    SW_CHECK(!run_.o.logging.dry_run, "--dry-run only prints the memory plan: Trainer.memory_plan() gives it");
    ranks_ = run_.mpi ? 1 : static_cast<int>(run_.ranks);  // the ranks of this process
    runner_ = std::thread([this] {
      try {
        cli::run_ranks(run_, [this](comm::Communicator& world_ref, std::shared_ptr<comm::Communicator> world) {
          rank_loop(world_ref, std::move(world));
        });
      } catch (...) {
        std::lock_guard lock(mu_);
        error_ = std::current_exception();
      }
      std::lock_guard lock(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }

  bool failed() {
    std::lock_guard lock(mu_);
    return ended_;
  }
  // command(op); when a signal's exception came meanwhile, the ranks stop (they may have already,
  // after the step), then it is raised.
  void stopping(Op op) {
    command(op);
    if (!signalled_) return;
    if (!done_) command(Op::Interrupt);
    nb::python_error e = std::move(*signalled_);
    signalled_.reset();
    throw e;
  }
  // Runs `op` on every rank (the GIL released) and waits; the run's error when a rank failed.
  void command(Op op) {
    SW_CHECK(!closed_ || op == Op::Finish, "the Trainer is closed");
    SW_CHECK(!abandoned_, "the Trainer was stopped by a second Ctrl-C while its ranks ran: close() it");
    {
      std::lock_guard lock(mu_);
      SW_CHECK(!ended_, "the Trainer's ranks have stopped after an error");
      op_ = op;
      acked_ = 0;
      ++generation_;
    }
    cv_.notify_all();
    wait(op, op != Op::Finish);
  }
  // Waits for every rank to finish `op`; with `signals`, runs the interpreter's signal handlers
  // every kSignalPoll meanwhile (see the class comment).
  void wait(Op op, bool signals) {
    nb::gil_scoped_release release;
    std::unique_lock lock(mu_);
    for (bool finished = false; !finished;) {
      finished = cv_.wait_for(lock, kSignalPoll, [&] { return acked_ == ranks_ || ended_; });
      if (!signals) continue;  // else once more when finished: a signal in a command shorter than the poll
      lock.unlock();
      std::optional<nb::python_error> raised = handler_raised();
      lock.lock();
      if (!raised) continue;
      if (signalled_ && !finished) {  // the second: at once
        abandoned_ = true;
        throw std::move(*raised);
      }
      if (!signalled_) signalled_.emplace(std::move(*raised));
      cli::request_stop(SIGINT);
    }
    if (acked_ == ranks_ && (op != Op::Finish || !error_)) return;
    lock.unlock();
    if (runner_.joinable()) runner_.join();
    if (error_) std::rethrow_exception(error_);
    if (op != Op::Finish) fail("the Trainer's ranks ended before the command finished");
  }
  // The exception a signal handler of the interpreter raised (KeyboardInterrupt), if any.
  static std::optional<nb::python_error> handler_raised() {
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return std::nullopt;
    return nb::python_error();
  }
  void ack() {
    std::lock_guard lock(mu_);
    ++acked_;
    cv_.notify_all();
  }
  void rank_loop(comm::Communicator& world_ref, std::shared_ptr<comm::Communicator> world) {
    const bool report = world_ref.rank() == 0;
    try {
      RankRun run(run_.o, run_.c, world_ref, std::move(world), std::cout);
      if (report) outcome_ = run.outcome(), done_ = run.done();
      ack();
      for (int64_t seen = 0;;) {
        Op op;
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [&] { return generation_ > seen || failing_; });
          if (failing_) return;  // another rank failed: its error ends the run
          seen = generation_;
          op = op_;
        }
        perform(run, op, report);
        if (report) outcome_ = run.outcome(), done_ = run.done();
        ack();
        if (op == Op::Finish) return;
      }
    } catch (...) {
      {
        std::lock_guard lock(mu_);
        failing_ = true;
      }
      cv_.notify_all();
      throw;
    }
  }
  void perform(RankRun& run, Op op, bool report) {
    switch (op) {
      case Op::Step: {
        const train::StepRecord r = run.step();
        if (report) record_ = train::record_json(r).dump(), records_.push_back(record_);
        break;
      }
      case Op::Evaluate: value_ = run.evaluate(); break;
      case Op::Validate: value_ = run.validate(); break;
      case Op::Predict: {
        std::map<std::string, Tensor> outs = run.predict(predict_in_);
        std::lock_guard lock(mu_);
        for (auto& [name, t] : outs) predicted_.try_emplace(name, std::move(t));
        break;
      }
      case Op::Save: {
        const std::string dir = run.save();
        if (report) saved_ = dir;
        break;
      }
      case Op::Interrupt: run.stop_if_asked(); break;
      case Op::Finish: run.finish(); break;
      case Op::Setup: break;
    }
  }

  cli::ParsedTrain parsed_;
  cli::PreparedRun run_;
  std::shared_ptr<FedBatch> fed_ = std::make_shared<FedBatch>();
  std::map<std::string, Tensor> predict_in_, predicted_;  // Trainer.evaluate(batch)'s inputs and outputs
  int ranks_ = 1;
  std::thread runner_;
  std::mutex mu_;
  std::condition_variable cv_;
  Op op_ = Op::Setup;
  int64_t generation_ = 0;
  int acked_ = 0;
  bool ended_ = false, failing_ = false, closed_ = false;
  bool abandoned_ = false;                          // a second Ctrl-C: the caller stopped waiting
  std::optional<nb::python_error> signalled_;       // the first Ctrl-C's KeyboardInterrupt, raised after the stop
  std::exception_ptr error_;
  // Rank 0's answers, read by the caller after every rank acknowledged the command.
  std::string record_, saved_;
  double value_ = 0;
  bool done_ = false;
  cli::TrainOutcome outcome_;
  std::vector<std::string> records_;
};

// `shardwise plan --memory --json` of the run the words describe (of a Python model's, with `model`).
std::string memory_plan(const std::vector<std::string>& args, nb::handle model, const std::string& description,
                        const std::vector<std::string>& feeds) {
  cli::ParsedTrain parsed = cli::parse_train_args(args);
  if (!model.is_none()) parsed.options.config.model.custom = python_model(model, description, "", feeds);
  parsed.options.logging.json = true;
  std::ostringstream out;
  nb::gil_scoped_release release;
  raising(ErrorKind::Usage, [&] { cli::cmd_plan_memory(parsed.options, cli::PlanOptions{}, out); });
  return out.str();
}

}  // namespace

void bind_train(nb::module_& m) {
  m.def(
      "_train_options",
      [](const std::vector<std::string>& args) {
        const cli::ParsedTrain parsed = cli::parse_train_args(args);
        return std::make_pair(parsed.options.options_line, parsed.resolved.dump());
      },
      nb::arg("args"), "`shardwise train ARGS`'s options line and every option's resolved value (JSON text).");
  m.def("_train", &train_run, nb::arg("args"), nb::arg("on_step").none(),
        "Runs `shardwise train ARGS`; on_step(metrics JSON line) on each step. The outcome as JSON text.");
  m.def("_memory_plan", &memory_plan, nb::arg("args"), nb::arg("model").none() = nb::none(),
        nb::arg("description") = "", nb::arg("feeds") = std::vector<std::string>{},
        "`shardwise plan --memory --json ARGS`'s JSON text (of a Python model's run; `feeds`: its fed inputs).");
  nb::class_<StepwiseRun>(m, "_StepwiseRun")
      .def(nb::init<const std::vector<std::string>&, nb::handle, const std::string&, const std::string&,
                    const std::vector<std::string>&>(),
           nb::arg("args"), nb::arg("model").none() = nb::none(), nb::arg("description") = "",
           nb::arg("model_config") = "", nb::arg("feeds") = std::vector<std::string>{})
      .def("step", &StepwiseRun::step, nb::arg("batch") = std::map<std::string, AnyArray>{})
      .def("evaluate", &StepwiseRun::evaluate)
      .def("validate", &StepwiseRun::validate, nb::arg("batch") = std::map<std::string, AnyArray>{})
      .def("predict", &StepwiseRun::predict, nb::arg("batch"))
      .def("save", &StepwiseRun::save)
      .def("interrupt", &StepwiseRun::interrupt)
      .def("close", &StepwiseRun::close)
      .def_prop_ro("done", &StepwiseRun::done)
      .def_prop_ro("records", &StepwiseRun::records)
      .def_prop_ro("ranks", &StepwiseRun::ranks)
      .def_prop_ro("run_dir", [](const StepwiseRun& r) { return r.outcome().run_dir; })
      .def_prop_ro("newest_checkpoint", [](const StepwiseRun& r) { return r.outcome().newest_checkpoint; })
      .def_prop_ro("steps_done", [](const StepwiseRun& r) { return r.outcome().steps_done; });
}

}  // namespace shardwise::py
