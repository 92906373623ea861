// Gradient buckets reduced while the backward runs (train/grad_buckets.h, --overlap-grad-reduce):
// the buckets' reductions against float sums in the local backend's rank order written here, and
// the training curves with overlap on against the same buckets reduced after the backward (bit for
// bit) and against the reduction left to the graph (plain dp, stage 2's ShardedOptimizer::reduce).
#include <gtest/gtest.h>

#include <numeric>

#include "shardwise/comm/local.h"
#include "shardwise/train/grad_buckets.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

// Rank r's gradient of parameter p: values with rounding in their sums.
Tensor grad_of(int r, size_t p, const Shape& shape) {
  Tensor t = Tensor::uninitialized(DType::F32, shape);
  float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = 0.1f * static_cast<float>(r + 1) + 1e-3f * static_cast<float>(i) / 7.0f + 0.37f * static_cast<float>(p);
  return t;
}

// The local backend's sum: rank 0's value, plus rank 1's, ... in float.
float rank_order_sum(int ranks, size_t p, const Shape& shape, int64_t i) {
  float acc = grad_of(0, p, shape).data<float>()[i];
  for (int r = 1; r < ranks; ++r) acc += grad_of(r, p, shape).data<float>()[i];
  return acc;
}

const std::vector<Shape> kShapes = {Shape{5, 7}, Shape{3}, Shape{64}, Shape{2, 9}, Shape{1}, Shape{40}};

// Two data groups, as dense parameters (all 4 ranks, dp x ep) and experts (the 2 ranks of a dp
// pair) on dp=2 x ep=2: parameters 0, 2, 4 reduced over the 4, 1, 3, 5 over the pair; each sum in
// its own group's rank order, each group's buckets apart (one open bucket per group), reduce-scatter
// into each group's own plan.
TEST(GradBuckets, EachParameterIsReducedOverItsOwnDataGroup) {
  const std::vector<int> group_of = {0, 1, 0, 1, 0, 1};
  for (const std::string mode : {"all_reduce", "v2"}) {
    for (int64_t bucket : {4, 1 << 20}) {
      comm::LocalWorld::run(4, [&](comm::Communicator& w) {
        const int ep = w.rank() % 2;  // world rank = dp * 2 + ep
        const std::vector<int> pair = {ep, 2 + ep};
        DataGroups g{{w.group(w.members()), w.group(pair)}, {{0, 1}, {0}}, group_of};
        std::vector<int64_t> numels;
        for (const Shape& s : kShapes) numels.push_back(s.numel());
        const ShardPlan plan = plan_shards("v2", numels, group_of, {4, 2}, {w.rank(), w.rank() / 2});
        GradBuckets buckets(g, mode == "all_reduce" ? nullptr : &plan, {bucket, true, 2});
        std::vector<Tensor> grads(kShapes.size());
        for (size_t p = 0; p < kShapes.size(); ++p) grads[p] = grad_of(w.rank(), p, kShapes[p]);
        for (size_t p : {5, 4, 3, 2, 1}) buckets.ready(p, grads[p]);
        std::vector<Tensor> out = buckets.finish(grads, std::vector<bool>(kShapes.size(), true));
        for (size_t p = 0; p < kShapes.size(); ++p) {
          const std::vector<int> members = group_of[p] == 0 ? std::vector<int>{0, 1, 2, 3} : pair;
          const Tensor& got = mode == "all_reduce" ? grads[p] : out[p];
          const int64_t begin = mode == "all_reduce" ? 0 : plan.begin(p);
          ASSERT_EQ(got.numel(), mode == "all_reduce" ? kShapes[p].numel() : plan.count(p));
          for (int64_t j = 0; j < got.numel(); ++j) {
            float want = grad_of(members[0], p, kShapes[p]).data<float>()[begin + j];
            for (size_t m = 1; m < members.size(); ++m) want += grad_of(members[m], p, kShapes[p]).data<float>()[begin + j];
            ASSERT_EQ(got.data<float>()[j], want) << mode << " bucket " << bucket << " parameter " << p << " element " << j;
          }
        }
        // Hand-over order per group: the groups' buckets never mix.
        for (const std::vector<size_t>& b : buckets.last_buckets())
          for (size_t p : b) EXPECT_EQ(group_of[p], group_of[b.front()]) << mode << " bucket " << bucket;
      });
    }
  }
}

// All-reduce and reduce-scatter (v1 and v2 plans) of six parameters in 4-element..64-element
// buckets, handed over in reverse order, one held back to finish(), one not to reduce.
TEST(GradBuckets, ReduceEachParameterAsOneCollectivePerParameterWould) {
  const int ranks = 4;
  for (const std::string mode : {"all_reduce", "v1", "v2"}) {
    for (bool overlap : {true, false}) {
      for (int64_t bucket : {4, 100, 1 << 20}) {
        comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
          auto dp = w.group(w.members());
          std::vector<int64_t> numels;
          for (const Shape& s : kShapes) numels.push_back(s.numel());
          ShardPlan plan = plan_shards(mode == "v1" ? "v1" : "v2", numels, ranks, w.rank());
          GradBuckets buckets(DataGroups{{dp}, {{0}}, std::vector<int>(kShapes.size(), 0)},
                              mode == "all_reduce" ? nullptr : &plan, {bucket, overlap, 2});
          std::vector<Tensor> grads(kShapes.size());
          std::vector<bool> reduce(kShapes.size(), true);
          reduce[3] = false;  // kept as it is (not Partial over dp)
          for (size_t p = 0; p < kShapes.size(); ++p) grads[p] = grad_of(w.rank(), p, kShapes[p]);
          for (size_t p : {5, 4, 2, 1, 0}) {  // 3 is not reduced, 2 is left to finish()
            if (p == 2) continue;
            buckets.ready(p, grads[p]);
            ASSERT_FALSE(grads[p].defined());
          }
          std::vector<Tensor> out = buckets.finish(grads, reduce);
          const std::string what = fmt::format("{} overlap {} bucket {} B", mode, overlap, bucket);
          if (mode == "all_reduce") {
            ASSERT_TRUE(out.empty());
            for (size_t p = 0; p < kShapes.size(); ++p) {
              ASSERT_EQ(grads[p].shape(), kShapes[p]) << what;
              for (int64_t i = 0; i < kShapes[p].numel(); ++i) {
                const float want = reduce[p] ? rank_order_sum(ranks, p, kShapes[p], i) : grad_of(w.rank(), p, kShapes[p]).data<float>()[i];
                ASSERT_EQ(grads[p].data<float>()[i], want) << what << " parameter " << p << " element " << i;
              }
            }
          } else {
            ASSERT_TRUE(grads.empty());
            for (size_t p = 0; p < kShapes.size(); ++p) {
              ASSERT_EQ(out[p].numel(), plan.count(p)) << what;
              for (int64_t j = 0; j < plan.count(p); ++j) {
                const int64_t i = plan.begin(p) + j;
                const float want = reduce[p] ? rank_order_sum(ranks, p, kShapes[p], i) : grad_of(w.rank(), p, kShapes[p]).data<float>()[i];
                ASSERT_EQ(out[p].data<float>()[j], want) << what << " parameter " << p << " element " << i;
              }
            }
          }
          // Buckets close in hand-over order once they hold `bucket` bytes; the held-back one last.
          std::vector<std::vector<size_t>> want;
          if (bucket == 4) want = {{5}, {4}, {1}, {0}, {2}};
          else if (bucket == 100) want = {{5}, {4, 1, 0}, {2}};  // 160 B; 4 + 12 + 140 B; then 256 B
          else want = {{5, 4, 1, 0, 2}};
          EXPECT_EQ(buckets.last_buckets(), want) << what;
          EXPECT_EQ(buckets.last_started_early(), overlap ? static_cast<int64_t>(want.size()) - 1 : 0) << what;
        });
      }
    }
  }
}

struct Curve {
  std::vector<double> losses;
  int64_t buckets = 0, early = 0;  // rank 0's last step
};

Curve train(const TrainConfig& c, int64_t steps) {
  Curve out;
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int64_t s = 0; s < steps; ++s) {
      const double l = t.step().loss;
      if (w.rank() == 0) out.losses.push_back(l);
    }
    if (w.rank() == 0 && t.grad_buckets()) {
      out.buckets = static_cast<int64_t>(t.grad_buckets()->last_buckets().size());
      out.early = t.grad_buckets()->last_started_early();
    }
  });
  return out;
}

TrainConfig with(TrainConfig c, const std::string& overlap, int stage, const std::string& layout = "v2") {
  c.parallel.overlap_grad_reduce = overlap;
  c.parallel.grad_bucket_mb = 8.0 / 1024;  // 8 KiB: several buckets on the small model
  c.parallel.sharding = {stage, layout};
  return c;
}

// Overlap on equals the same buckets reduced after the backward bit for bit (the same collectives
// on the same sums: what overlap changes is when), and follows the graph's own reduction within
// 1e-5: bit for bit at stage 2 (the same f32 sums over the micro-batches, each element reduced in
// rank order), within rounding at stages 0 and 1 with 2 micro-batches (the graph reduces each
// micro-batch's gradient, the buckets their sum: as stage 2 does).
TEST(GradOverlap, OnEqualsAfterBitForBitAndFollowsTheGraphsReductionOnEveryMesh) {
  for (const std::string mesh : {"dp=2", "dp=4", "dp=2,tp=2", "pp=2,dp=2"}) {
    TrainConfig c = small_config(mesh, 6);
    c.optimizer.accumulation = 2, c.optimizer.micro_batch = 0;
    for (auto [stage, layout] : {std::pair{0, "v2"}, std::pair{1, "v1"}, std::pair{2, "v2"}, std::pair{2, "v1"}}) {
      if (stage == 2 && std::string(layout) == "v1" && mesh != "dp=4") continue;
      const std::string what = fmt::format("{} stage {} {}", mesh, stage, layout);
      const Curve off = train(with(c, "off", stage, layout), 6);
      const Curve on = train(with(c, "on", stage, layout), 6);
      const Curve after = train(with(c, "after", stage, layout), 6);
      EXPECT_EQ(on.losses, after.losses) << what;
      ASSERT_EQ(on.losses.size(), off.losses.size());
      for (size_t i = 0; i < off.losses.size(); ++i) {
        EXPECT_NEAR(on.losses[i], off.losses[i], 1e-5 * off.losses[i]) << what << " step " << i + 1;
        if (stage == 2) {
          EXPECT_EQ(on.losses[i], off.losses[i]) << what << " step " << i + 1;
        }
      }
      EXPECT_GT(on.buckets, 2) << what;
      EXPECT_GE(on.early, on.buckets - 2) << what << ": the buckets start during the backward";
      EXPECT_EQ(after.early, 0) << what;
    }
  }
}

// One micro-batch: the graph's all-reduce per gradient and the buckets add the same numbers in the
// same order, so plain dp with and without overlap is bit for bit; zero-bubble hands the weight
// gradients over from its split backward.
TEST(GradOverlap, OneMicroBatchAndZeroBubbleKeepTheBits) {
  TrainConfig c = small_config("dp=2,tp=2", 6);
  c.optimizer.accumulation = 1, c.optimizer.micro_batch = 0;
  EXPECT_EQ(train(with(c, "on", 0), 6).losses, train(with(c, "off", 0), 6).losses);
  TrainConfig z = small_config("pp=2,dp=2", 6);
  z.optimizer.accumulation = 4, z.optimizer.micro_batch = 0, z.parallel.schedule = "zbh1";
  const Curve on = train(with(z, "on", 2), 6);
  EXPECT_EQ(on.losses, train(with(z, "off", 2), 6).losses);
  EXPECT_EQ(on.losses, train(with(z, "after", 2), 6).losses);
  EXPECT_GE(on.early, 1);
}

TEST(GradOverlap, BadOptionsAreRefusedNamingThem) {
  TrainConfig c = small_config("dp=2", 1);
  c.parallel.overlap_grad_reduce = "yes";
  try {
    c.check(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--overlap-grad-reduce must be on"), std::string::npos) << e.what();
  }
  c.parallel.overlap_grad_reduce = "on", c.parallel.grad_bucket_mb = 0;
  try {
    c.check(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--grad-bucket-mb must be a positive"), std::string::npos) << e.what();
  }
  c.parallel.grad_bucket_mb = 1, c.parallel.sharding = {3, "v1"};  // stage 3 reduce-scatters in the graph
  try {
    c.check(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--overlap-grad-reduce on does not combine with --sharding-stage 3"),
              std::string::npos)
        << e.what();
  }
  c.parallel.overlap_grad_reduce = "off";
  EXPECT_NO_THROW(c.check(2));
}

}  // namespace
}  // namespace shardwise::train
