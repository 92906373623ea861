#include "shardwise/cli/plan/calibrate_cmd.h"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "shardwise/cli/plan/kernel_calibrate.h"
#include "shardwise/cli/plan/machine_cache.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"
#include "shardwise/core/table.h"
#include "shardwise/core/timing.h"
#include "shardwise/plan/calibrate.h"
#include "shardwise/train/optimizer.h"

namespace shardwise::cli {

using nlohmann::json;

namespace {

constexpr const char* kCacheFile = "calibration.json";

std::string today() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

void print_table(const json& j, std::ostream& out) {
  const json& cal = j["calibration"];
  using A = TextTable::Align;
  TextTable gemm({A::Left, A::Right, A::Right, A::Right, A::Right});
  gemm.row({"GEMM dtype", "m", "n", "k", "GFLOP/s"});
  for (const auto& g : cal["gemm"])
    gemm.row({g["dtype"].get<std::string>(), std::to_string(g["m"].get<int64_t>()), std::to_string(g["n"].get<int64_t>()),
              std::to_string(g["k"].get<int64_t>()), fmt::format("{:.2f}", g["flops_per_s"].get<double>() / 1e9)});
  out << gemm.str();
  const json& m = cal["memory"];
  out << fmt::format("memory-bound ({} over {} elements): {:.2f} GB/s\n", m["op"].get<std::string>(),
                     m["elements"].get<int64_t>(), m["bytes_per_s"].get<double>() / 1e9);
  TextTable coll({A::Left, A::Right, A::Right, A::Right, A::Left});
  coll.row({"collective (threads)", "ranks", "latency us", "bandwidth GB/s", "note"});
  for (auto it = cal["collectives"].begin(); it != cal["collectives"].end(); ++it)
    coll.row({it.key(), std::to_string(it.value()["ranks"].get<int>()),
              fmt::format("{:.2f}", it.value()["latency"].get<double>() * 1e6),
              // null: the larger message was not slower, so no finite bandwidth was measured (the note says so)
              it.value()["bandwidth"].is_number() ? fmt::format("{:.2f}", it.value()["bandwidth"].get<double>() / 1e9)
                                                  : std::string("unbounded"),
              it.value()["note"].get<std::string>()});
  if (cal.contains("mpi")) {
    for (auto it = cal["mpi"]["collectives"].begin(); it != cal["mpi"]["collectives"].end(); ++it)
      coll.row({"mpi " + it.key(), std::to_string(it.value()["ranks"].get<int>()),
                fmt::format("{:.2f}", it.value()["latency"].get<double>() * 1e6),
                it.value()["bandwidth"].is_number() ? fmt::format("{:.2f}", it.value()["bandwidth"].get<double>() / 1e9)
                                                    : std::string("unbounded"),
                it.value()["note"].get<std::string>()});
  }
  out << coll.str();
  if (!cal.contains("mpi")) out << "MPI collectives: not measured (`shardwise calibrate --mpi`, or `calibrate` under mpirun)\n";
  if (cal.contains("kernels"))
    out << fmt::format("kernel fits: {} instruction types over {} reference runs; {:.3g} ms a step outside them, {} cores\n",
                       cal["kernels"].size(), cal["references"].size(), cal.value("step_overhead_s", 0.0) * 1e3,
                       cal.value("cores", 0));
  if (cal.contains("optimizer"))
    out << fmt::format("optimizer (AdamW update): {:.1f} M elements/s\n", cal["optimizer"]["elements_per_s"].get<double>() / 1e6);
}

// The optimizer's update as a training step runs it (train/optimizer.h AdamW::update over one f32
// block, weight decay on): elements a second, the median of 5 after a warm-up. On a CPU the update
// is compute-bound (a square root and a division an element), far slower than its 7 streams of
// memory traffic at the `add` bandwidth would say.
json measure_optimizer(bool quick) {
  const int64_t n = quick ? (1 << 16) : (1 << 22);
  std::vector<float> w(static_cast<size_t>(n), 0.5f), m(static_cast<size_t>(n), 0.f), v(static_cast<size_t>(n), 0.f),
      g(static_cast<size_t>(n), 0.01f);
  const train::AdamW adamw(train::AdamWConfig{0.9, 0.95, 1e-8, 0.01});
  int64_t step = 0;
  const double t = median_seconds(quick ? 1 : 5, [&] { adamw.update(w.data(), m.data(), v.data(), g.data(), n, true, 1e-3, ++step); });
  return {{"op", "AdamW::update"}, {"elements", n}, {"seconds", t}, {"elements_per_s", static_cast<double>(n) / t}};
}

}  // namespace

CLI::App* add_calibrate_command(CLI::App& app, CalibrateCliOptions& o) {
  auto* cmd = app.add_subcommand("calibrate", "Measure this machine (GEMM, memory, collectives) for plan --predict and cache it");
  cmd->add_flag("--quick", o.quick, "small shapes and messages, one repetition (seconds; rough numbers, cached too)");
  cmd->add_option("--ranks", o.ranks, "threads the collectives run on (2 to 64)")->capture_default_str();
  cmd->add_flag("--show", o.show, "print the cached calibration of this machine, measure nothing");
  cmd->add_flag("--json", o.json, "print the calibration as JSON (a cluster description, --cluster's format)");
  cmd->add_flag("--mpi", o.mpi,
                "then measure MPI's collectives between --ranks processes (runs mpirun; $SHARDWISE_MPIRUN replaces "
                "the launcher); under mpirun, calibrate measures only those and adds them to the cached calibration");
  return cmd;
}

json load_calibration_json() {
  auto path = machine_cache_path(kCacheFile);
  std::ifstream in(path);
  SW_CHECK(in.good(), "no calibration cached for this machine ({}): run `shardwise calibrate`", path.string());
  json j = json::parse(in, nullptr, false);
  SW_CHECK(!j.is_discarded(), "the calibration cache {} is corrupt (not valid JSON): run `shardwise calibrate` again",
           path.string());
  try {
    plan::parse_cluster(j, path.string());
  } catch (const Error& e) {
    fail("the calibration cache is corrupt ({}): run `shardwise calibrate` again", e.what());
  }
  SW_CHECK(j.contains("calibration") && j["calibration"].is_object() && j["calibration"].value("key", "") != "",
           "the calibration cache {} is corrupt (no calibration.key): run `shardwise calibrate` again", path.string());
  SW_CHECK(j["calibration"]["key"] == machine_cache_key(),
           "the calibration cache {} was measured on another machine (or with other GEMM libraries): run `shardwise "
           "calibrate` again",
           path.string());
  return j;
}

plan::ClusterSpec load_calibration(bool mpi, bool require_mpi) {
  plan::ClusterSpec c = plan::parse_cluster(load_calibration_json(), machine_cache_path(kCacheFile).string());
  SW_CHECK(!mpi || !require_mpi || c.mpi_link.bandwidth > 0,
           "the calibration {} has no MPI collectives: run `shardwise calibrate --mpi`",
           machine_cache_path(kCacheFile).string());
  return plan::for_backend(c, mpi);
}

bool predicts_mpi(const std::string& backend) {
  SW_CHECK(backend == "auto" || backend == "threads" || backend == "mpi", "--backend '{}': use auto, threads or mpi",
           backend);
  return backend == "mpi" || (backend == "auto" && comm::launched_by_mpirun());
}

namespace {

// Under mpirun: MPI's collectives between the job's processes, added to this machine's cached
// calibration by the first process (the threads' measurements are `calibrate` without mpirun: its
// ranks would otherwise measure the machine twice at once).
int calibrate_mpi(const CalibrateCliOptions& o, std::ostream& out) {
  json j = load_calibration_json();  // every process: the same error when there is none
  auto world = comm::mpi_world();
  const json mpi = plan::calibrate_mpi_collectives(*world, o.quick);
  if (world->rank() != 0) return 0;
  j["calibration"]["mpi"] = mpi;
  j["sources"]["calibration.mpi"] = "the collectives between MPI processes (calibrate under mpirun): MPI runs' links";
  write_machine_cache(machine_cache_path(kCacheFile), j.dump(1) + "\n", "calibration cache");
  if (o.json) out << j.dump(1) << "\n";
  else print_table(j, out);
  return 0;
}

// `calibrate --mpi` after the threads' measurements are cached: the same program's calibrate on
// `ranks` MPI processes ($SHARDWISE_MPIRUN or mpirun, as root with --allow-run-as-root).
void launch_mpi_calibration(const CalibrateCliOptions& o) {
  const char* env = std::getenv("SHARDWISE_MPIRUN");
  std::string launcher = env != nullptr && *env != '\0' ? env
                         : ::geteuid() == 0       ? "mpirun --allow-run-as-root --oversubscribe --bind-to none"
                                                  : "mpirun --oversubscribe --bind-to none";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = fmt::format("{} -np {} '{}' calibrate{} > /dev/null", launcher, o.ranks, self,
                                          o.quick ? " --quick" : "");
  const int rc = std::system(command.c_str());
  SW_CHECK(rc == 0, "calibrate --mpi: `{}` failed (exit status {}): is MPI installed and mpirun on PATH?", command, rc);
}

}  // namespace

int cmd_calibrate(const CalibrateCliOptions& o, std::ostream& out) {
  if (comm::launched_by_mpirun() && !o.show) return calibrate_mpi(o, out);
  json j;
  if (o.show) {
    j = load_calibration_json();
  } else {
    j = plan::calibrate_machine({o.quick, o.ranks});
    j["calibration"]["optimizer"] = measure_optimizer(o.quick);
    j["sources"]["calibration.optimizer"] = "AdamW::update over one f32 block: the optimizer's time a step (plan --predict)";
    json k = measure_kernels(plan::parse_cluster(j, "calibrate"), o.quick);
    for (const char* key : {"kernels", "references", "step_overhead_s", "instruction_gap_s", "busy_kernel_scales",
                            "reference_ratios"})
      j["calibration"][key] = k[key];
    j["sources"]["calibration.kernels"] = "reference training runs on one rank, profiled: each instruction type's fit";
    j["calibration"]["key"] = machine_cache_key();
    j["calibration"]["measured"] = today();
    write_machine_cache(machine_cache_path(kCacheFile), j.dump(1) + "\n", "calibration cache");
    if (o.mpi) {
      launch_mpi_calibration(o);
      j = load_calibration_json();
    }
  }
  if (o.json) {
    out << j.dump(1) << "\n";
    return 0;
  }
  print_table(j, out);
  out << fmt::format("cached in {} ({}{})\n", machine_cache_path(kCacheFile).string(),
                     j["calibration"].value("measured", "?"), j["calibration"].value("quick", false) ? ", quick" : "");
  return 0;
}

}  // namespace shardwise::cli
