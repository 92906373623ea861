// The shardwise command as a user runs it: output of `infer` and `rules`, and one clear error
// line with a non-zero exit for bad input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

using shardwise_cli_test::lines;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

TEST(Cli, InferPrintsRequiredPlacementsOutputsAndLocalShapes) {
  Result r = run("infer matmul --mesh 2,2 --shapes 8x16,16x4 --placements \"S(0),R;R,S(1)\"");
  ASSERT_EQ(r.status, 0) << r.out;
  // Column-parallel: out [8,4] is S(0) on mesh dim 0 and S(1) on mesh dim 1: local 4x2.
  EXPECT_NE(r.out.find("output 0: f32 8x4 [S(0),S(1)]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 3 1,1: local 4x2 at offset [4,2]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("input 1: f32 16x4 [R,S(1)]"), std::string::npos) << r.out;
}

TEST(Cli, InferShowsPartialSumForAShardedContraction) {
  Result r = run("infer matmul --mesh 2 --shapes 8x16,16x4 --placements \"S(1);S(0)\"");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("output 0: f32 8x4 [P(sum)]"), std::string::npos) << r.out;
}

TEST(Cli, InferWithAttrsAndUnevenShards) {
  Result r = run("infer sum --mesh 3 --shapes 5x7 --placements \"S(1)\" --attrs \"axis=[1],keepdim=true\"");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("output 0: f32 5x1 [P(sum)]"), std::string::npos) << r.out;
  // 7 over 3 ranks: 3, 3, 1.
  EXPECT_NE(r.out.find("rank 2 2: local 5x1 at offset [0,6]"), std::string::npos) << r.out;
}

// Collective ops (context kernels only) work with infer, their gradient rules included.
TEST(Cli, InferCollectiveOpsForwardAndGrad) {
  Result r = run("infer vocab_parallel_cross_entropy --mesh 2,2 --shapes 8x5,8 --dtypes f32,i64 "
                 "--placements \"S(0),S(1);R,R\" --attrs reduction=sum");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("input 0: f32 8x5 [S(0),S(1)]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("output 0: f32 scalar [P(sum),R]"), std::string::npos) << r.out;
  r = run("infer sync_batch_norm --part grad --mesh 2 --shapes 8x4,4,4,4,4 "
          "--placements \"S(0);R;R;R;R;S(0);R;R;R;R\"");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("grad 0: f32 8x4 [S(0)]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("grad 1: f32 4 [R]"), std::string::npos) << r.out;
}

TEST(Cli, RulesListsEveryFamily) {
  Result r = run("rules");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* s : {"[unary]", "[binary]", "[reduction]", "[matmul]", "ops: add, subtract", "reduce_sum"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
}

TEST(Cli, BadInputGivesOneErrorLineAndExitStatus2) {
  const char* cases[][2] = {
      {"infer nosuchop --mesh 2 --shapes 4 --placements R", "unknown op 'nosuchop'"},
      {"infer add --mesh 2 --shapes 4 --placements R", "takes 2 inputs but --shapes gives 1"},
      {"infer exp --mesh 2,2 --shapes 4x4 --placements \"S(0)\"", "name 1 mesh dims but the mesh has 2"},
      {"infer exp --mesh 2 --shapes 4x4 --placements \"S(2)\"", "names tensor dim 2, but the tensor has rank 2"},
      {"infer exp --mesh 2x0 --shapes 4 --placements R", "not a positive size"},
      {"infer exp --mesh 2 --shapes 4xq --placements R", "cannot read shape"},
      {"infer exp --mesh 2 --shapes 4 --placements \"Q(1)\"", "cannot read placement"},
      {"infer sum --mesh 2 --shapes 4x4 --placements R --attrs \"axis=[5]\"", "axis"},
  };
  for (auto& [args, expected] : cases) {
    Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_EQ(lines(r.out), 1) << args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("shardwise: error: ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find(expected), std::string::npos) << args << "\n" << r.out;
  }
}

TEST(Cli, UnknownOptionIsRejected) {
  Result r = run("infer exp --mesh 2 --shapes 4 --placements R --bogus 1");
  EXPECT_NE(r.status, 0);
}

TEST(Cli, PlanReshardPrintsTheStepsAndTheirCost) {
  Result r = run("plan-reshard --shape 1024x4096 --from \"mesh=2x2 S(0),P\" --to \"mesh=2x2 R,S(1)\"");
  ASSERT_EQ(r.status, 0) << r.out;
  // 16 MiB f32: reduce_scatter over tp leaves a quarter on each rank, then all_gather over dp.
  EXPECT_NE(r.out.find("1. reduce_scatter(sum) along mesh dim 1 onto tensor dim 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2. all_gather along mesh dim 0 of tensor dim 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("total: 2 step(s), 8388608 B sent by the busiest rank"), std::string::npos) << r.out;
  r = run("plan-reshard --shape 8x8 --from \"mesh=2 ranks=0,1 S(0)\" --to \"mesh=2 ranks=2,3 S(1)\"");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("send_recv"), std::string::npos) << r.out;
  r = run("plan-reshard --shape 8x8 --from \"mesh=2 S(2)\" --to \"mesh=2 R\"");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("shardwise: error: the source layout"), std::string::npos) << r.out;
}

TEST(Cli, PlanShowsTheProgramAndExplainsAPlacement) {
  Result r = run("plan --mesh tp=2 --layers 1");
  ASSERT_EQ(r.status, 0) << r.out;
  // The row-parallel projection's Partial sum is all-reduced, once, before the bias and residual.
  EXPECT_NE(r.out.find("transformer.h.0.attn.c_proj.mm[P(sum)] = matmul("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_reduce(sum) along mesh dim 0"), std::string::npos) << r.out;
  r = run("plan --mesh dp=2,tp=2 --explain 'transformer.h.0.attn.c_attn(q).mm'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[S(0),S(2)] — output 0 of node transformer.h.0.attn.c_attn(q).mm = matmul"), std::string::npos)
      << r.out;
  r = run("plan --mesh dp=2,tp=3 --heads 4");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("4 heads cannot be split over tp=3"), std::string::npos) << r.out;
  r = run("plan --mesh dp=2,xp=2");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("name every dim dp, tp, pp, ep or cp"), std::string::npos) << r.out;
}

TEST(Cli, TrainRefusesBadConfigurationsBeforeItStarts) {
  struct Bad {
    std::string args, message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"train --mesh dp=2,tp=2 --ranks 3", "mesh [dp=2,tp=2] has 4 ranks but 3 ranks run"},
           {"train --mesh tp=3 --heads 4", "4 heads cannot be split over tp=3"},
           {"train --data /nonexistent/file.txt", "cannot read the data file '/nonexistent/file.txt'"},
           {"train --mesh dp=2 --global-batch 10 --micro-batch 4", "global batch 10 is not a multiple of micro-batch 4 x dp 2"},
           {"train --digits 3 --seq 8", "sequence length 8 is too short for 3-digit addition"},
           {"train --mesh dp=2,zp=2", "mesh [dp=2,zp=2]: dim 1 is named 'zp'; name every dim dp, tp, pp, ep or cp"},
       }) {
    Result r = run(b.args + " --run-dir " + tmp("shardwise-cli-bad-run"));
    EXPECT_EQ(r.status, 2) << b.args << "\n" << r.out;
    EXPECT_EQ(lines(r.out), 1) << b.args << "\n" << r.out;
    EXPECT_NE(r.out.find("shardwise: error: " + b.message), std::string::npos) << b.args << "\n" << r.out;
  }
  Result r = run("train --no-such-option 3");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--no-such-option"), std::string::npos) << r.out;
}

TEST(Cli, TrainWritesItsLogAndCurveAndLearns) {
  std::string dir = tmp("shardwise-cli-train-run");
  std::system(("rm -rf " + dir).c_str());
  Result r = run("train --mesh dp=2 --layers 1 --hidden 32 --steps 30 --global-batch 16 --lr 0.003 --warmup 5 --eval-every 10 "
                 "--run-dir " + dir);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("done: 30 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("held-out exact match"), std::string::npos) << r.out;
  std::ifstream jsonl(dir + "/metrics.jsonl");
  std::string line, first, last;
  int n = 0;
  while (std::getline(jsonl, line)) {
    if (n++ == 0) first = line;
    last = line;
  }
  EXPECT_EQ(n, 30);
  EXPECT_NE(last.find("\"accuracy\""), std::string::npos) << last;
  auto loss_of = [](const std::string& l) { return std::stod(l.substr(l.find("\"loss\":") + 7)); };
  EXPECT_LT(loss_of(last), loss_of(first) * 0.7) << first << "\n" << last;
  std::ifstream svg(dir + "/loss_curve.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<polyline"), std::string::npos);
}

}  // namespace

namespace {

TEST(Cli, PipelinePrintsActionListsBubbleAndPeak) {
  Result r = run("pipeline --schedule 1f1b --stages 4 --micro-batches 8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0: F0 sendA0>1 F1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 3: recvA0<2 F0"), std::string::npos) << r.out;
  // (p-1)/(m+p-1) = 3/11; the first rank holds p = 4 micro-batches.
  EXPECT_NE(r.out.find("bubble fraction 0.2727 (closed form (p-1)/(m+p-1) = 0.2727), peak activations 4 micro-batches"),
            std::string::npos)
      << r.out;
  std::string svg = ::testing::TempDir() + "/pipeline.svg";
  Result s = run("pipeline --schedule interleaved --stages 2 --virtual 2 --micro-batches 4 --svg " + svg);
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("(p-1)/(v*m+p-1) = 0.1111"), std::string::npos) << s.out;
  std::ifstream f(svg);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
}

TEST(Cli, PipelineRefusesImpossibleConfigurations) {
  Result r = run("pipeline --schedule zbh1 --stages 4 --micro-batches 3");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("shardwise: error: zbh1: 3 micro-batches for 4 pipeline ranks"), std::string::npos) << r.out;
  Result v = run("pipeline --schedule 1f1b --stages 2 --virtual 2");
  EXPECT_EQ(v.status, 2);
  EXPECT_NE(v.out.find("needs the interleaved schedule"), std::string::npos) << v.out;
}

}  // namespace
