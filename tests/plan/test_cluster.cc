// The cluster description: the shipped presets load with their datasheet numbers, and each kind of
// bad input is an Error naming the key at fault.
#include <gtest/gtest.h>

#include <fstream>

#include "shardwise/core/error.h"
#include "shardwise/plan/cluster.h"

using namespace shardwise;
using namespace shardwise::plan;
using nlohmann::json;

namespace {

std::string preset(const std::string& name) { return std::string(SHARDWISE_SOURCE_DIR) + "/examples/clusters/" + name; }

json minimal() {
  return json::parse(R"({"name": "toy", "nodes": 2, "devices_per_node": 4,
    "device": {"peak_flops": {"f32": 1e12, "tf32": 2e12, "bf16": 4e12}, "memory_bytes": 1e9, "memory_bandwidth": 1e11},
    "links": {"intra_node": {"bandwidth": 1e10, "latency": 1e-6}, "inter_node": {"bandwidth": 1e9, "latency": 1e-5}}})");
}

std::string error_of(const json& j) {
  try {
    parse_cluster(j, "toy.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Cluster, A100PresetHasTheDatasheetNumbers) {
  ClusterSpec c = load_cluster(preset("a100-80gb-dgx.json"));
  EXPECT_EQ(c.devices(), 3072);
  EXPECT_DOUBLE_EQ(c.peak("bf16"), 312e12);
  EXPECT_DOUBLE_EQ(c.peak("tf32"), 156e12);
  EXPECT_DOUBLE_EQ(c.memory_bandwidth, 2.039e12);
  EXPECT_DOUBLE_EQ(c.intra_node.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(c.factor("compute"), 1.0);  // no factor given: 1
}

TEST(Cluster, H100PresetHasTheDatasheetNumbers) {
  ClusterSpec c = load_cluster(preset("h100-80gb.json"));
  EXPECT_EQ(c.devices(), 16384);
  EXPECT_DOUBLE_EQ(c.peak("bf16"), 989.4e12);
  EXPECT_DOUBLE_EQ(c.memory_bandwidth, 3.35e12);
}

TEST(Cluster, EveryPresetNumberNamesItsSource) {
  for (const char* name : {"a100-80gb-dgx.json", "h100-80gb.json"}) {
    json j = cluster_json(load_cluster(preset(name)));
    for (const char* key : {"nodes", "device.peak_flops", "device.memory_bytes", "device.memory_bandwidth",
                            "links.intra_node.bandwidth", "links.inter_node.bandwidth", "links.intra_node.latency",
                            "links.inter_node.latency"})
      EXPECT_TRUE(j["sources"].contains(key)) << name << " lacks a source for " << key;
  }
}

TEST(Cluster, RoundTripsThroughJson) {
  ClusterSpec c = parse_cluster(minimal(), "toy.json");
  c.efficiency["network"] = 0.5;
  ClusterSpec d = parse_cluster(cluster_json(c), "again");
  EXPECT_EQ(cluster_json(d), cluster_json(c));
  EXPECT_DOUBLE_EQ(d.factor("network"), 0.5);
}

TEST(Cluster, ErrorsNameTheKey) {
  json j = minimal();
  j["links"]["inter_node"].erase("bandwidth");
  EXPECT_EQ(error_of(j), "toy.json: key 'links.inter_node.bandwidth' is missing");
  j = minimal();
  j["device"]["peak_flops"]["bf16"] = -3;
  EXPECT_EQ(error_of(j), "toy.json: key 'device.peak_flops.bf16' expects a positive number, got -3");
  j = minimal();
  j["device"]["memory_bandwith"] = 1;  // a typo
  EXPECT_NE(error_of(j).find("unknown key 'device.memory_bandwith'"), std::string::npos) << error_of(j);
  j = minimal();
  j["nodes"] = 1.5;
  EXPECT_NE(error_of(j).find("key 'nodes' expects a whole number"), std::string::npos) << error_of(j);
  j = minimal();
  j["efficiency"] = {{"compute", 1.2}};
  EXPECT_EQ(error_of(j), "toy.json: key 'efficiency.compute' expects a factor in (0, 1], got 1.2");
  j = minimal();
  j["efficiency"] = {{"kernels", 0.5}};  // only three names
  EXPECT_NE(error_of(j).find("unknown key 'efficiency.kernels'"), std::string::npos) << error_of(j);
}

TEST(Cluster, UnreadableOrInvalidFileSaysSo) {
  EXPECT_THROW(load_cluster("/nonexistent/cluster.json"), Error);
  std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/bad_cluster.json";
  std::ofstream(path) << "{\"name\": ";
  try {
    load_cluster(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": not valid JSON");
  }
}

TEST(Cluster, ACalibrationsGemmShapesAreRead) {
  json j = minimal();
  j["calibration"] = {{"quick", false},
                      {"gemm", {{{"dtype", "f32"}, {"m", 512}, {"n", 768}, {"k", 3072}, {"seconds", 0.1}, {"flops_per_s", 4.8e10}},
                                {{"dtype", "bf16"}, {"m", 128}, {"n", 128}, {"k", 32}, {"seconds", 0.1}, {"flops_per_s", 5e9}}}}};
  ClusterSpec c = parse_cluster(j, "toy.json");
  ASSERT_EQ(c.gemm_rates.size(), 2u);
  EXPECT_EQ(c.gemm_rates[0].dtype, "f32");
  EXPECT_EQ(c.gemm_rates[0].n, 768);
  EXPECT_DOUBLE_EQ(c.gemm_rates[1].flops_per_s, 5e9);
  EXPECT_TRUE(parse_cluster(minimal(), "toy.json").gemm_rates.empty());
  j["calibration"]["gemm"][1]["flops_per_s"] = 0;
  EXPECT_EQ(error_of(j), "toy.json: key 'calibration.gemm.flops_per_s' expects a positive number, got 0");
}

TEST(Cluster, ACalibrationsKernelFitsOverheadsAndCoresAreRead) {
  json j = minimal();
  j["calibration"] = {{"kernels", {{"layer_norm", {{"overhead_s", 2e-6}, {"scale", 3.5}, {"samples", json::array()}}}}},
                      {"step_overhead_s", 1e-3}, {"instruction_gap_s", 4e-6}, {"cores", 2},
                      {"rank_factors", {{"2", 1.5}, {"4", 2.5}}}, {"mesh_factors", {{"[pp=2]", 3.0}}},
                      {"busy_kernel_scales", {{"flash_attention", 1.25}}}};
  ClusterSpec c = parse_cluster(j, "toy.json");
  ASSERT_EQ(c.kernel_fits.count("layer_norm"), 1u);
  EXPECT_DOUBLE_EQ(c.kernel_fits["layer_norm"].overhead_s, 2e-6);
  EXPECT_DOUBLE_EQ(c.kernel_fits["layer_norm"].scale, 3.5);
  EXPECT_DOUBLE_EQ(c.step_overhead_s, 1e-3);
  EXPECT_DOUBLE_EQ(c.instruction_gap_s, 4e-6);
  EXPECT_EQ(c.cores, 2);
  EXPECT_EQ(c.rank_factors, (std::map<int64_t, double>{{2, 1.5}, {4, 2.5}}));
  EXPECT_EQ(c.mesh_factors, (std::map<std::string, double>{{"[pp=2]", 3.0}}));
  EXPECT_EQ(c.busy_kernel_scales, (std::map<std::string, double>{{"flash_attention", 1.25}}));
  j["calibration"]["kernels"]["layer_norm"]["scale"] = -1;
  EXPECT_EQ(error_of(j), "toy.json: key 'calibration.kernels.layer_norm' expects {overhead_s, scale}, two numbers >= 0");
  j["calibration"]["kernels"]["layer_norm"]["scale"] = 1;
  j["calibration"]["step_overhead_s"] = "soon";
  EXPECT_EQ(error_of(j), "toy.json: key 'calibration.step_overhead_s' expects a number >= 0");
  j["calibration"]["step_overhead_s"] = 0;
  j["calibration"]["rank_factors"]["2"] = 0;
  EXPECT_EQ(error_of(j), "toy.json: key 'calibration.rank_factors.2' expects a positive number, got 0");
  j["calibration"]["rank_factors"]["2"] = 1;
  j["calibration"]["busy_kernel_scales"]["flash_attention"] = 0;
  EXPECT_EQ(error_of(j), "toy.json: key 'calibration.busy_kernel_scales.flash_attention' expects a positive number, got 0");
}

// calibration.mpi.link (the collectives `calibrate` measured between MPI processes) is read, and
// for_backend(c, true) gives a run of MPI processes that link on both levels; threads, or a
// description without one, keep their own links.
TEST(Cluster, ACalibrationsMpiLinkIsWhatAnMpiRunIsPredictedWith) {
  json j = minimal();
  j["calibration"] = {{"mpi", {{"ranks", 2}, {"collectives", json::object()}, {"link", {{"bandwidth", 3e9}, {"latency", 7e-6}}}}}};
  const ClusterSpec c = parse_cluster(j, "toy.json");
  EXPECT_DOUBLE_EQ(c.mpi_link.bandwidth, 3e9);
  EXPECT_DOUBLE_EQ(c.mpi_link.latency, 7e-6);
  const ClusterSpec mpi = for_backend(c, true);
  for (const LinkSpec& l : {mpi.intra_node, mpi.inter_node}) {
    EXPECT_DOUBLE_EQ(l.bandwidth, 3e9);
    EXPECT_DOUBLE_EQ(l.latency, 7e-6);
  }
  const ClusterSpec threads = for_backend(c, false);
  EXPECT_DOUBLE_EQ(threads.intra_node.bandwidth, 1e10);
  EXPECT_DOUBLE_EQ(threads.inter_node.latency, 1e-5);
  // MPI processes poll in their collectives (their waits hold a core); threads block.
  EXPECT_TRUE(mpi.waits_hold_cores);
  EXPECT_FALSE(threads.waits_hold_cores);
  const ClusterSpec none = for_backend(parse_cluster(minimal(), "toy.json"), true);  // nothing measured
  EXPECT_DOUBLE_EQ(none.intra_node.bandwidth, 1e10);
  j["calibration"]["mpi"]["link"]["bandwidth"] = 0;
  EXPECT_EQ(error_of(j), "toy.json: key 'calibration.mpi.link.bandwidth' expects a positive number, got 0");
  j["calibration"]["mpi"] = "fast";
  EXPECT_EQ(error_of(j), "toy.json: key 'calibration.mpi' expects an object with a link {bandwidth, latency}");
}
