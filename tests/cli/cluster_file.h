#pragma once
// The plan tests' cluster descriptions (docs/planner.md), written to the tests' temporary
// directory, their JSON runs, and runs with a calibration cache of their own.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_cli.h"

namespace shardwise_cli_test {

// The plan tests' model: 2 layers of 64, 4 heads, seq 32, a global batch of 8.
inline const std::string kPlanModel = "--layers 2 --hidden 64 --heads 4 --seq 32 --global-batch 8";

struct ToyCluster {
  std::string name = "toy";
  int devices_per_node = 4;
  double peak = 1e10, memory_bytes = 1e12, memory_bandwidth = 1e10;
  double intra_bandwidth = 1e9, inter_bandwidth = 1e8, latency = 1e-5;
  double optimizer_elements_per_s = 0;  // > 0: a calibration's measured AdamW update
  nlohmann::json calibration = nlohmann::json::object();  // more of a calibration's keys (cores, ...)
};

// One node; the file is named after the cluster and `tag`.
inline std::string write_cluster(const ToyCluster& t, const std::string& tag) {
  nlohmann::json c = {
      {"name", t.name}, {"nodes", 1}, {"devices_per_node", t.devices_per_node},
      {"device", {{"peak_flops", {{"f32", t.peak}, {"tf32", t.peak}, {"bf16", t.peak}}}, {"memory_bytes", t.memory_bytes},
                  {"memory_bandwidth", t.memory_bandwidth}}},
      {"links", {{"intra_node", {{"bandwidth", t.intra_bandwidth}, {"latency", t.latency}}},
                 {"inter_node", {{"bandwidth", t.inter_bandwidth}, {"latency", t.latency}}}}}};
  if (t.optimizer_elements_per_s > 0) c["calibration"] = {{"optimizer", {{"elements_per_s", t.optimizer_elements_per_s}}}};
  for (auto it = t.calibration.begin(); it != t.calibration.end(); ++it) c["calibration"][it.key()] = it.value();
  const std::string path = tmp(t.name + "_" + tag + ".json");
  std::ofstream(path) << c.dump();
  return path;
}

// An empty cache directory (XDG_CACHE_HOME) named for a test, and a command run with it: its
// calibration and gemm-check caches.
inline std::filesystem::path fresh_cache(const std::string& name) {
  std::filesystem::path d = tmp("calibrate_cache_" + name);
  std::filesystem::remove_all(d);
  return d;
}

inline Result run_cached(const std::filesystem::path& cache, const std::string& args) {
  return run_command("XDG_CACHE_HOME=" + cache.string() + " " +
                     (std::getenv("SHARDWISE_BIN") ? std::getenv("SHARDWISE_BIN") : "shardwise") + " " + args);
}

// The command's stdout as JSON; a failure (naming the output) when it fails or is not JSON.
inline nlohmann::json run_json(const std::string& args) {
  Result r = run(args);
  EXPECT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

}  // namespace shardwise_cli_test
