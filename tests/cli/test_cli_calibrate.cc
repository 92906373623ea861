// `shardwise calibrate`: the measurement is cached per machine as a cluster description and read
// back unchanged, a corrupt or foreign cache is refused naming the file, and the values are
// positive and self-consistent (each collective's alpha-beta fit reproduces its end points); under
// mpirun MPI's collectives are added, and `--mpi` launches mpirun itself.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cluster_file.h"
#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using shardwise_cli_test::Result;

using shardwise_cli_test::fresh_cache;

Result sw(const fs::path& cache, const std::string& args) { return shardwise_cli_test::run_cached(cache, args); }

json parse_json(const Result& r) {
  json j = json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

}  // namespace

TEST(CliCalibrate, QuickRunIsCachedAndReadBackUnchanged) {
  fs::path cache = fresh_cache("roundtrip");
  Result r = sw(cache, "calibrate --quick --json");
  ASSERT_EQ(r.status, 0) << r.out;
  json measured = parse_json(r);
  ASSERT_TRUE(fs::exists(cache / "shardwise" / "calibration.json"));
  r = sw(cache, "calibrate --show --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(parse_json(r), measured);
  r = sw(cache, "calibrate --show");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("GEMM dtype"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cached in " + (cache / "shardwise" / "calibration.json").string()), std::string::npos) << r.out;
}

// A collective whose larger message was not slower (often so on a loaded machine) is cached with a
// null bandwidth; --show prints it as unbounded instead of aborting on the null.
TEST(CliCalibrate, AnUnboundedBandwidthIsShownAsSuch) {
  fs::path cache = fresh_cache("unbounded");
  Result r = sw(cache, "calibrate --quick --json");
  ASSERT_EQ(r.status, 0) << r.out;
  json j = parse_json(r);
  j["calibration"]["collectives"]["all_reduce"]["bandwidth"] = nullptr;
  j["calibration"]["collectives"]["all_reduce"]["note"] = "the larger message was not slower: bandwidth taken as unbounded";
  std::ofstream(cache / "shardwise" / "calibration.json") << j.dump();
  r = sw(cache, "calibrate --show");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("unbounded"), std::string::npos) << r.out;
}

TEST(CliCalibrate, ValuesArePositiveAndTheFitsReproduceTheirPoints) {
  fs::path cache = fresh_cache("values");
  Result r = sw(cache, "calibrate --quick --json --ranks 3");
  ASSERT_EQ(r.status, 0) << r.out;
  json j = parse_json(r);
  EXPECT_EQ(j["devices_per_node"], 3);
  for (const char* d : {"f32", "tf32", "bf16"}) EXPECT_GT(j["device"]["peak_flops"][d].get<double>(), 0) << d;
  EXPECT_GT(j["device"]["memory_bandwidth"].get<double>(), 0);
  double best_f32 = 0;
  for (const auto& g : j["calibration"]["gemm"]) {
    const double flops = 2.0 * g["m"].get<double>() * g["n"].get<double>() * g["k"].get<double>();
    EXPECT_NEAR(g["flops_per_s"].get<double>(), flops / g["seconds"].get<double>(), 1e-6 * flops / g["seconds"].get<double>());
    if (g["dtype"] == "f32") best_f32 = std::max(best_f32, g["flops_per_s"].get<double>());
  }
  EXPECT_DOUBLE_EQ(j["device"]["peak_flops"]["f32"].get<double>(), best_f32);
  const json& mem = j["calibration"]["memory"];
  EXPECT_DOUBLE_EQ(mem["bytes"].get<double>(), 3.0 * mem["elements"].get<double>() * 4);
  for (const char* kind : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) {
    const json& c = j["calibration"]["collectives"][kind];
    ASSERT_TRUE(c.is_object()) << kind;
    EXPECT_EQ(c["ranks"], 3);
    ASSERT_EQ(c["points"].size(), 3u) << kind;  // 4 KB, a mid size and the largest
    for (const auto& p : c["points"]) EXPECT_GT(p[1].get<double>(), 0) << kind;
    for (size_t i : {0, 2}) {  // the line through the smallest and the largest
      const double bytes = c["points"][i][0].get<double>(), seconds = c["points"][i][1].get<double>();
      EXPECT_NEAR(c["a"].get<double>() + c["b"].get<double>() * bytes, seconds, 1e-9 + 1e-9 * seconds) << kind;
    }
  }
  // The kernel fits: every reference's instruction types fitted (each >= 0), the reshards from the
  // two-rank references, and the cores the ranks share.
  const json& kernels = j["calibration"]["kernels"];
  for (const char* type : {"matmul", "matmul_grad", "flash_attention", "layer_norm", "reshard"}) {
    ASSERT_TRUE(kernels.contains(type)) << type << " " << kernels.dump();
    EXPECT_GE(kernels[type]["overhead_s"].get<double>(), 0) << type;
    EXPECT_GE(kernels[type]["scale"].get<double>(), 0) << type;
  }
  EXPECT_GE(j["calibration"]["cores"].get<int64_t>(), 1);
  EXPECT_GE(j["calibration"]["step_overhead_s"].get<double>(), 0);
  // The multi-rank references' measured over predicted steps are recorded, not applied: a
  // calibration sets no rank or mesh factor, so a prediction takes ranks / cores beyond the cores.
  const json& ratios = j["calibration"]["reference_ratios"];
  EXPECT_TRUE(ratios["by_ranks"].contains("2")) << ratios.dump();
  EXPECT_TRUE(ratios["by_mesh"].contains("[dp=2]")) << ratios.dump();
  EXPECT_FALSE(j["calibration"].contains("rank_factors"));
  EXPECT_FALSE(j["calibration"].contains("mesh_factors"));
  // With a rank on every core in the two-rank references (this machine's 2 cores), each type both
  // they and the single-rank references run has a busy scale, measured over fitted.
  if (j["calibration"]["cores"].get<int64_t>() == 2) {
    const json& busy = j["calibration"]["busy_kernel_scales"];
    for (const char* type : {"matmul", "layer_norm"}) {
      ASSERT_TRUE(busy.contains(type)) << type << " " << busy.dump();
      EXPECT_GT(busy[type].get<double>(), 0) << type;
    }
    EXPECT_FALSE(busy.contains("reshard"));
  }
  // links.intra_node is all_reduce's fit (its latency clamped at 0 when the intercept was negative).
  EXPECT_DOUBLE_EQ(j["links"]["intra_node"]["latency"].get<double>(),
                   std::max(0.0, j["calibration"]["collectives"]["all_reduce"]["latency"].get<double>()));
}

TEST(CliCalibrate, CorruptOrForeignOrMissingCacheIsRefusedNamingTheFile) {
  fs::path cache = fresh_cache("corrupt");
  const std::string file = (cache / "shardwise" / "calibration.json").string();
  Result r = sw(cache, "calibrate --show");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("no calibration cached for this machine (" + file + "): run `shardwise calibrate`"),
            std::string::npos) << r.out;
  ASSERT_EQ(sw(cache, "calibrate --quick").status, 0);
  json good = json::parse(std::ifstream(file));
  std::ofstream(file) << "{\"name\": ";  // truncated
  r = sw(cache, "calibrate --show");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("the calibration cache " + file + " is corrupt (not valid JSON)"), std::string::npos) << r.out;
  json bad = good;
  bad["device"]["memory_bandwidth"] = -1;
  std::ofstream(file) << bad.dump();
  r = sw(cache, "calibrate --show");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("key 'device.memory_bandwidth' expects a positive number, got -1"), std::string::npos) << r.out;
  bad = good;
  bad["calibration"]["key"] = "another machine";
  std::ofstream(file) << bad.dump();
  r = sw(cache, "calibrate --show");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("was measured on another machine"), std::string::npos) << r.out;
}

namespace {

// The JSON object a command printed (under mpirun, another process's stderr may come first).
json json_from(const Result& r) {
  const size_t at = r.out.find('{');
  json j = json::parse(at == std::string::npos ? std::string() : r.out.substr(at), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

const char* kTp2 = "--layers 1 --hidden 32 --heads 2 --seq 16 --vocab 64 --global-batch 2 --mesh tp=2";

}  // namespace

// Under mpirun, calibrate measures MPI's collectives between its processes (three sizes each, the
// line through the smallest and largest inverted as the threads' are) and adds them to the cached
// calibration; `plan --predict --backend mpi` then times a run's collectives on that link: with
// MPI's all-reduce made 10 ms at every size (the reshard fit and rank factors set to 1), a tp=2
// step's all-reduces (at least 2) make it more than 20 ms slower than on threads. Without MPI collectives `--backend mpi` is refused,
// naming the fix.
TEST(CliCalibrate, UnderMpirunTheMpiCollectivesAreCachedAndPredictMpiRunsWithThem) {
  fs::path cache = fresh_cache("mpi");
  ASSERT_EQ(sw(cache, "calibrate --quick").status, 0);
  Result r = sw(cache, std::string("plan --predict --json --backend mpi ") + kTp2);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("has no MPI collectives: run `shardwise calibrate --mpi`"), std::string::npos) << r.out;
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  r = shardwise_cli_test::run_command("XDG_CACHE_HOME=" + cache.string() + " " + SHARDWISE_MPIRUN_LINE + " -np 2 " + bin +
                                      " calibrate --quick --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const json mpi = json_from(r)["calibration"]["mpi"];
  ASSERT_TRUE(mpi.is_object()) << r.out;
  EXPECT_EQ(mpi["ranks"], 2);
  for (const char* kind : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) {
    const json& c = mpi["collectives"][kind];
    ASSERT_EQ(c["points"].size(), 3u) << kind;
    for (const auto& p : c["points"]) EXPECT_GT(p[1].get<double>(), 0) << kind;
    for (size_t i : {0, 2}) {  // the fit's line through the smallest and the largest point
      const double bytes = c["points"][i][0].get<double>(), seconds = c["points"][i][1].get<double>();
      EXPECT_NEAR(c["a"].get<double>() + c["b"].get<double>() * bytes, seconds, 1e-9 + 1e-9 * seconds) << kind;
    }
  }
  EXPECT_DOUBLE_EQ(mpi["link"]["latency"].get<double>(), std::max(0.0, mpi["collectives"]["all_reduce"]["latency"].get<double>()));
  r = sw(cache, "calibrate --show");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("mpi all_reduce"), std::string::npos) << r.out;
  // A 10 ms MPI link: the mpi prediction pays it, the threads one does not.
  const std::string file = (cache / "shardwise" / "calibration.json").string();
  json j = json::parse(std::ifstream(file));
  j["calibration"]["mpi"]["link"] = {{"bandwidth", 1e12}, {"latency", 0.01}};
  j["calibration"]["mpi"]["collectives"]["all_reduce"]["points"] = {{4096, 0.01}, {16777216, 0.01}};
  // the reshards timed as modelled, no rank factor: the quick fits would scale the link away
  j["calibration"]["kernels"]["reshard"] = {{"overhead_s", 0}, {"scale", 1}};
  j["calibration"]["rank_factors"] = {{"2", 1.0}};
  j["calibration"]["mesh_factors"] = json::object();
  std::ofstream(file) << j.dump();
  const json threads = parse_json(sw(cache, std::string("plan --predict --json --backend threads ") + kTp2));
  const json on_mpi = parse_json(sw(cache, std::string("plan --predict --json --backend mpi ") + kTp2));
  EXPECT_EQ(threads["backend"], "threads");
  EXPECT_EQ(on_mpi["backend"], "mpi");
  EXPECT_GT(on_mpi["step_time_s"].get<double>(), threads["step_time_s"].get<double>() + 0.02) << on_mpi.dump() << threads.dump();
}

// `calibrate --mpi` measures the threads, caches them, then runs itself under mpirun
// ($SHARDWISE_MPIRUN: the test suite's launcher) for MPI's collectives.
TEST(CliCalibrate, TheMpiOptionLaunchesMpirunItself) {
  fs::path cache = fresh_cache("mpi_option");
  Result r = shardwise_cli_test::run_command("SHARDWISE_MPIRUN='" + std::string(SHARDWISE_MPIRUN_LINE) + "' XDG_CACHE_HOME=" +
                                             cache.string() + " " + std::getenv("SHARDWISE_BIN") + " calibrate --quick --mpi --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json_from(r);
  EXPECT_TRUE(j["calibration"]["collectives"].contains("all_reduce")) << r.out;
  EXPECT_EQ(j["calibration"]["mpi"]["ranks"], 2) << r.out;
  r = shardwise_cli_test::run_command("SHARDWISE_MPIRUN=/nonexistent/mpirun XDG_CACHE_HOME=" + cache.string() + " " +
                                      std::getenv("SHARDWISE_BIN") + " calibrate --quick --mpi");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("calibrate --mpi: `/nonexistent/mpirun -np 2"), std::string::npos) << r.out;
}
