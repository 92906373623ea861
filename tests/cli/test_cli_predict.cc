// `shardwise plan --predict`: the prediction adds up (on a cluster where only compute costs time,
// the step is the rank's matmul FLOPs over the peak, and MFU is 1), scales with the peak, a pipeline
// adds the schedule's bubble, and a mesh larger than the cluster is refused.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cluster_file.h"
#include "run_cli.h"

namespace {

using nlohmann::json;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;

const std::string kModel = shardwise_cli_test::kPlanModel;

// A cluster of 4 devices where memory and links cost nothing measurable: only matmul FLOPs count.
std::string compute_only_cluster(double peak) {
  shardwise_cli_test::ToyCluster t{"compute-only", 4, peak, 1e12, 1e300, 1e300, 1e300, 0};
  return shardwise_cli_test::write_cluster(t, std::to_string(static_cast<int64_t>(peak)));
}

json predict(const std::string& args) { return shardwise_cli_test::run_json("plan --predict --json " + kModel + " " + args); }

}  // namespace

TEST(CliPredict, OnlyComputeCostsTimeOnAComputeOnlyCluster) {
  for (const char* mesh : {"dp=1", "dp=2", "tp=2", "dp=2,tp=2"}) {
    json j = predict(std::string("--mesh ") + mesh + " --cluster " + compute_only_cluster(1e9));
    const double flops = j["flops_per_rank"].get<double>();
    EXPECT_GT(flops, 0) << mesh;
    EXPECT_NEAR(j["step_time_s"].get<double>(), flops / 1e9, 1e-9 * flops / 1e9) << mesh;
    EXPECT_NEAR(j["mfu"].get<double>(), 1.0, 1e-9) << mesh;
    EXPECT_NEAR(j["shares"]["compute"].get<double>(), 1.0, 1e-9) << mesh;
    // tokens/s: the global batch's tokens over the step.
    EXPECT_NEAR(j["tokens_per_s"].get<double>(), 8 * 32 / j["step_time_s"].get<double>(), 1e-6 * j["tokens_per_s"].get<double>());
    json twice = predict(std::string("--mesh ") + mesh + " --cluster " + compute_only_cluster(2e9));
    EXPECT_NEAR(twice["step_time_s"].get<double>(), j["step_time_s"].get<double>() / 2, 1e-12) << mesh;
  }
  // dp=2 splits the global batch: each rank multiplies half the rows dp=1's rank does.
  const std::string cluster = " --cluster " + compute_only_cluster(1e9);
  EXPECT_DOUBLE_EQ(predict("--mesh dp=1" + cluster)["flops_per_rank"].get<double>(),
                   2 * predict("--mesh dp=2" + cluster)["flops_per_rank"].get<double>());
}

TEST(CliPredict, RefusesAMeshLargerThanTheClusterAndAClusterWithoutPredict) {
  const std::string cluster = " --cluster " + compute_only_cluster(1e9);
  Result r = run("plan --predict " + kModel + " --mesh dp=8" + cluster);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("the mesh [dp=8] needs 8 devices; cluster 'compute-only' has 4"), std::string::npos) << r.out;
  r = run("plan " + kModel + cluster);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--cluster goes with --predict"), std::string::npos) << r.out;
}

// --backend is the calibration's (a cluster description has its own links) and goes with --predict or
// --auto; --symmetric goes with --memory: each misplaced one is refused, naming it.
TEST(CliPredict, TheBackendAndSymmetricOptionsAreRefusedWhereTheyMeanNothing) {
  const std::string cluster = " --cluster " + compute_only_cluster(1e9);
  Result r = run("plan --predict --backend mpi " + kModel + " --mesh dp=2" + cluster);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--backend mpi is for this machine's calibration: a cluster description"), std::string::npos) << r.out;
  r = run("plan --memory --backend threads " + kModel);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--backend goes with --predict or --auto"), std::string::npos) << r.out;
  r = run("plan --predict --symmetric " + kModel + cluster);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--symmetric goes with --memory"), std::string::npos) << r.out;
  r = run("plan --predict --backend fast " + kModel + cluster);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--backend"), std::string::npos) << r.out;
}

TEST(CliPredict, APipelineAddsTheSchedulesBubble) {
  // pp=2, GPipe over 4 micro-batches on a compute-only cluster: the bubble is the simulator's idle
  // time of the slowest rank, and the shares add up to the step.
  const std::string args = "--mesh pp=2 --accumulation 4 --schedule fthenb --cluster " + compute_only_cluster(1e9);
  json j = predict(args);
  double sum = 0;
  for (auto it = j["shares"].begin(); it != j["shares"].end(); ++it) sum += it.value().get<double>();
  EXPECT_NEAR(sum, 1.0, 1e-9) << j.dump();
  // Every stage is given the slowest rank's times: GPipe's step is (m + p - 1) = 5 of its
  // micro-batches, of which 4 compute: the bubble is 1/5 of the step.
  EXPECT_NEAR(j["shares"]["bubble"].get<double>(), 0.2, 1e-9) << j.dump();
}

TEST(CliPredict, AMeasuredOptimizerRateTimesTheUpdate) {
  // On the compute-only cluster with a calibrated AdamW rate of 1e6 elements/s, the optimizer's part
  // is the rank's parameters over it (without one: 7 f32 streams at an unbounded bandwidth, 0).
  shardwise_cli_test::ToyCluster t{"compute-only", 4, 1e9, 1e12, 1e300, 1e300, 1e300, 0};
  t.optimizer_elements_per_s = 1e6;
  const std::string cluster = " --cluster " + shardwise_cli_test::write_cluster(t, "adamw");
  json j = predict("--mesh dp=1 --vocab 128" + cluster);
  const double parameters = static_cast<double>(shardwise_cli_test::gpt2_parameters(2, 64, 32, 128));
  EXPECT_NEAR(j["shares"]["optimizer"].get<double>() * j["step_time_s"].get<double>(), parameters / 1e6, 1e-9);
  EXPECT_NEAR(j["by_op"]["optimizer adamw"].get<double>(), parameters / 1e6, 1e-9);
  EXPECT_LT(predict("--mesh dp=1 --vocab 128 --cluster " + compute_only_cluster(1e9))["shares"]["optimizer"].get<double>(), 1e-200);
}

TEST(CliPredict, TheShardingStagesCostTheirCollectivesAndShareTheUpdate) {
  // dp=2 on one node (intra-node 1e9 B/s, latency 1e-5 s), AdamW at 1e6 elements/s, P parameters in
  // T = 36 tensors (GPT-2 of 2 layers: wte, wpe, 16 a layer: q, k, v, the attention output, the MLP's
  // two and two norms, weights and biases; the final norm's 2). Stage 0 (the
  // gradients all-reduced in the graph): the whole update, no sync of its own. Stage 1: half the
  // update and the parameters all-gathered, one call a tensor (layout v1): T latencies + 1/2 x 4P
  // bytes. Stage 2 with layout v2 and the buckets (one): the gradients reduce-scattered and the
  // parameters all-gathered in one call each, 2 x (1 latency + 1/2 x 4P bytes).
  shardwise_cli_test::ToyCluster t{"stages", 4, 1e9, 1e12, 1e300, 1e9, 1e9, 1e-5};
  t.optimizer_elements_per_s = 1e6;
  const std::string args = "--mesh dp=2 --vocab 128 --cluster " + shardwise_cli_test::write_cluster(t, "stages");
  const double P = static_cast<double>(shardwise_cli_test::gpt2_parameters(2, 64, 32, 128)), T = 36;
  auto part = [](const json& j, const char* name) {
    return j["shares"].value(name, 0.0) * j["step_time_s"].get<double>();
  };
  const json s0 = predict(args), s1 = predict(args + " --sharding-stage 1");
  const json s2 = predict(args + " --sharding-stage 2 --sharding-layout v2 --overlap-grad-reduce on");
  EXPECT_NEAR(part(s0, "optimizer"), P / 1e6, 1e-9);
  EXPECT_NEAR(part(s0, "grad_sync"), 0, 1e-12);
  EXPECT_NEAR(part(s1, "optimizer"), P / 2 / 1e6, 1e-9);
  EXPECT_NEAR(part(s1, "grad_sync"), T * 1e-5 + 0.5 * 4 * P / 1e9, 1e-9);
  EXPECT_NEAR(part(s2, "optimizer"), P / 2 / 1e6, 1e-9);
  EXPECT_NEAR(part(s2, "grad_sync"), 2 * (1e-5 + 0.5 * 4 * P / 1e9), 1e-9);
  EXPECT_NE(s0["step_time_s"], s1["step_time_s"]);
}

TEST(CliPredict, RanksBeyondTheCalibratedCoresShareThemAndAStepHasItsOverhead) {
  // A calibration of one core with 1 ms a step outside the instructions and 1 us between two: on
  // the compute-only cluster a step is (the FLOPs' time + 1 ms + 1 us an instruction) x the ranks
  // per core.
  shardwise_cli_test::ToyCluster t{"one-core", 4, 1e9, 1e12, 1e300, 1e300, 1e300, 0};
  t.calibration = {{"cores", 1}, {"step_overhead_s", 1e-3}, {"instruction_gap_s", 1e-6}};
  const std::string cluster = " --cluster " + shardwise_cli_test::write_cluster(t, "overhead");
  for (const char* mesh : {"dp=1", "dp=2"}) {
    const json j = predict(std::string("--mesh ") + mesh + cluster);
    const json plain = predict(std::string("--mesh ") + mesh + " --cluster " + compute_only_cluster(1e9));
    ASSERT_TRUE(j.contains("instructions")) << j.dump();
    const double instructions = j["instructions"].get<double>();
    EXPECT_GT(instructions, 10) << mesh;
    const double ranks = std::string(mesh) == "dp=2" ? 2 : 1;
    EXPECT_NEAR(j["step_time_s"].get<double>(), ranks * (plain["step_time_s"].get<double>() + 1e-3 + 1e-6 * instructions),
                1e-9) << mesh;
  }
  // A measured factor for 2 ranks replaces ranks / cores.
  t.name = "measured-factor";
  t.calibration["rank_factors"] = {{"2", 3.0}};
  const std::string measured = " --cluster " + shardwise_cli_test::write_cluster(t, "factor");
  const json j = predict("--mesh dp=2" + measured), two_cores = predict("--mesh dp=2" + cluster);
  EXPECT_NEAR(j["step_time_s"].get<double>(), 1.5 * two_cores["step_time_s"].get<double>(), 1e-9);
  // And one measured on the mesh itself replaces that for that mesh only.
  t.name = "mesh-factor";
  t.calibration["mesh_factors"] = {{"[dp=2]", 5.0}};
  const std::string on_mesh = " --cluster " + shardwise_cli_test::write_cluster(t, "mesh");
  EXPECT_NEAR(predict("--mesh dp=2" + on_mesh)["step_time_s"].get<double>(), 2.5 * two_cores["step_time_s"].get<double>(), 1e-9);
  EXPECT_NEAR(predict("--mesh tp=2" + on_mesh)["step_time_s"].get<double>(),
              1.5 * predict("--mesh tp=2" + cluster)["step_time_s"].get<double>(), 1e-9);
}

// Ranks beyond the cores: their kernels share the cores, but a thread waiting in a collective
// gives its core up (the threads backend waits on a condition variable), so on one core dp=2 x tp=2
// takes 4 x the ranks' own work and 1 x the collectives' (before: 4 x all of it, the threads' rows
// of bench/predict_vs_measured.sh predicted 24-37% slow). MPI processes poll: their waits hold the
// core (plan::for_backend, tests/plan/test_cluster.cc).
TEST(CliPredict, AThreadWaitingInACollectiveLeavesItsCoreToTheOthers) {
  shardwise_cli_test::ToyCluster t{"one-core-links", 4, 1e9, 1e12, 1e300, 1e8, 1e8, 1e-5};
  t.calibration = {{"cores", 1}, {"step_overhead_s", 1e-3}};
  const std::string one_core = " --cluster " + shardwise_cli_test::write_cluster(t, "waits");
  t.name = "own-cores", t.calibration = {{"step_overhead_s", 1e-3}};
  const std::string own_cores = " --cluster " + shardwise_cli_test::write_cluster(t, "waits");
  const json shared = predict("--mesh dp=2,tp=2" + one_core), alone = predict("--mesh dp=2,tp=2" + own_cores);
  auto part = [](const json& j, const std::string& name) { return j["shares"].value(name, 0.0) * j["step_time_s"].get<double>(); };
  double collectives = 0;
  for (const auto& [name, share] : alone["shares"].items())
    if (name != "compute" && name != "bubble" && name != "optimizer" && name != "step_overhead") collectives += part(alone, name);
  ASSERT_GT(collectives, 0.05 * alone["step_time_s"].get<double>()) << alone.dump();
  EXPECT_NEAR(shared["step_time_s"].get<double>(), 4 * (alone["step_time_s"].get<double>() - collectives) + collectives,
              1e-9);
  EXPECT_NEAR(part(shared, "compute"), 4 * part(alone, "compute"), 1e-9);
  EXPECT_NEAR(part(shared, "grad_sync"), part(alone, "grad_sync"), 1e-9);
}

TEST(CliPredict, TheAnalyticModelCountsALayersFlopsByHand) {
  // kPlanModel on one rank, micro-batch 8 of seq 32, hidden 64 (4 heads of 16), MLP 256, vocab 128:
  // a layer 2 b s (64 x 16 x 12 + 4 x 16 x 64 + 2 x 64 x 256) + 4 b s^2 64 / 2 (the fused core's causal
  // half), two of them and the head 2 b s 64 x 128; the backward twice the forward.
  const double b = 8, s = 32;
  const double layer = 2 * b * s * (64 * 16 * 12 + 4 * 16 * 64 + 2 * 64 * 256) + 4 * b * s * s * 64 / 2;
  const double flops = 3 * (2 * layer + 2 * b * s * 64 * 128);
  json j = predict("--mesh dp=1 --vocab 128 --analytic --cluster " + compute_only_cluster(1e9));
  EXPECT_EQ(j["model"], "analytic");
  EXPECT_DOUBLE_EQ(j["flops_per_rank"].get<double>(), flops);
  EXPECT_NEAR(j["step_time_s"].get<double>(), flops / 1e9, 1e-9);
  Result r = run("plan --analytic " + kModel);
  EXPECT_NE(r.out.find("--analytic goes with --predict or --auto"), std::string::npos) << r.out;
  // Uneven stages, interleaved too: ceil(layers / chunks) a chunk (an upper bound: split_layers
  // gives the extras to the middle chunks), 3 layers on pp=2 as 4 on pp=2; 5 on pp=2 x 2 virtual as 8.
  const std::string uneven = "plan --predict --analytic --json --hidden 64 --heads 4 --seq 32 --global-batch 8 --cluster " +
                             compute_only_cluster(1e9);
  EXPECT_DOUBLE_EQ(shardwise_cli_test::run_json(uneven + " --layers 3 --mesh pp=2")["step_time_s"].get<double>(),
                   shardwise_cli_test::run_json(uneven + " --layers 4 --mesh pp=2")["step_time_s"].get<double>());
  const std::string interleaved = " --mesh pp=2 --schedule interleaved --virtual 2 --micro-batch 1";
  EXPECT_DOUBLE_EQ(shardwise_cli_test::run_json(uneven + " --layers 5" + interleaved)["step_time_s"].get<double>(),
                   shardwise_cli_test::run_json(uneven + " --layers 8" + interleaved)["step_time_s"].get<double>());
}
