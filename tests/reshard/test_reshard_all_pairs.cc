// Every pair of distributions on meshes [2], [4], [2,2], [2,3], and with dims of one rank [1],
// [1,2], [2,1]: a random global tensor is cut into the source shards (Partial dims split into
// unequal random parts) by the verifier's simulated mesh, resharded on threads, and the result is
// put back together from the target placements and compared with the global tensor: bit for bit
// where no arithmetic happens, within a rounding tolerance where partial values were reduced.
// No plan has a step that moves nothing (a collective over one rank, a slice that cuts nothing):
// a data-parallel gradient at dp = 1 is P(sum) -> R over one rank.
#include <gtest/gtest.h>

#include <set>

#include "shardwise/comm/local.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise::reshard {
namespace {

using mesh::DistAttr;
using mesh::Placement;
using mesh::ProcessMesh;

// Every distribution of a 2-D tensor on `mesh_ndim` mesh dims, both co-shard orders included.
std::vector<DistAttr> every_dist(int mesh_ndim, bool partials) {
  std::vector<Placement> options = {Placement::replicate(), Placement::shard(0), Placement::shard(1)};
  if (partials) {
    for (auto op : {mesh::ReduceOp::Sum, mesh::ReduceOp::Avg, mesh::ReduceOp::Max, mesh::ReduceOp::Min})
      options.push_back(Placement::partial(op));
  }
  std::vector<DistAttr> out;
  int64_t count = 1;
  for (int m = 0; m < mesh_ndim; ++m) count *= static_cast<int64_t>(options.size());
  for (int64_t i = 0; i < count; ++i) {
    DistAttr d(mesh_ndim);
    int64_t rest = i;
    for (int m = 0; m < mesh_ndim; ++m) {
      d.set(m, options[static_cast<size_t>(rest % static_cast<int64_t>(options.size()))]);
      rest /= static_cast<int64_t>(options.size());
    }
    out.push_back(d);
    for (int t = 0; t < 2 && mesh_ndim == 2; ++t) {
      if (d.mesh_dims_of(t).size() == 2) {
        DistAttr r = d;
        int8_t reversed[] = {1, 0};
        r.set_shard_order(t, reversed);
        out.push_back(r);
      }
    }
  }
  return out;
}

struct Outcome {
  int checked = 0;
  std::vector<std::string> failures;
};

// Why `plan` has a step that moves nothing, or "".
std::string idle_step(const Plan& plan) {
  for (const Step& s : plan.steps) {
    const ProcessMesh& m = s.before.mesh;
    if (s.kind == StepKind::SendRecv) continue;
    if (m.size() == 1) return "a step on a mesh of one rank: " + s.to_string();
    if (s.mesh_dim >= 0 && m.dim_size(s.mesh_dim) == 1) return "a step over a mesh dim of one rank: " + s.to_string();
    if (s.kind != StepKind::LocalSlice) continue;
    bool cuts = false;
    for (int64_t r = 0; r < m.size() && !cuts; ++r) {
      const auto coords = m.coords(r);
      cuts = block_at(plan.shape, s.before, coords).shape != block_at(plan.shape, s.after, coords).shape;
    }
    if (!cuts) return "a slice that cuts nothing: " + s.to_string();
  }
  return "";
}

// Reshards every pair of distributions from `from` to `to` (meshes of processes 0..world-1) with
// `strategy`; returns the failures.
Outcome check_all_pairs(const ProcessMesh& from, const ProcessMesh& to, int world, const Shape& shape,
                        PlanOptions::Strategy strategy) {
  std::vector<DistAttr> src_dists = every_dist(from.ndim(), true), dst_dists = every_dist(to.ndim(), true);
  Philox rng(1234, stream_id("reshard"));
  Tensor global = verify::random_tensor(shape, DType::F64, {}, rng);
  std::vector<std::vector<Tensor>> sources;
  for (const DistAttr& d : src_dists) sources.push_back(verify::distribute(global, d, from, Philox(99, stream_id(d.to_string()))));
  const size_t ns = src_dists.size(), nd = dst_dists.size();
  std::vector<std::vector<Tensor>> results(ns * nd, std::vector<Tensor>(static_cast<size_t>(to.size())));
  std::vector<Plan> plans(ns * nd);
  PlanOptions options;
  options.strategy = strategy;
  comm::LocalWorld::run(world, [&](comm::Communicator& c) {
    Resharder resharder(c.group(c.members()));
    const int64_t me = c.rank();
    for (size_t a = 0; a < ns; ++a) {
      for (size_t b = 0; b < nd; ++b) {
        Plan plan = plan_reshard(shape, DType::F64, {from, src_dists[a]}, {to, dst_dists[b]}, {}, options);
        Tensor in = from.contains(me) ? sources[a][static_cast<size_t>(from.rank_index_of_process(me))] : Tensor();
        Tensor out = resharder.run(plan, in);
        if (to.contains(me)) results[a * nd + b][static_cast<size_t>(to.rank_index_of_process(me))] = out;
        else if (out.defined()) fail("rank {} is not in the target mesh but got a tensor", me);
        if (me == 0) plans[a * nd + b] = plan;
      }
    }
  });
  Outcome o;
  for (size_t a = 0; a < ns; ++a) {
    for (size_t b = 0; b < nd; ++b) {
      std::string error;
      Tensor back = verify::assemble(results[a * nd + b], shape, DType::F64, dst_dists[b], to, error);
      // Reducing a Partial (in the reshard, or when assembling a Partial target) rounds.
      bool arithmetic = src_dists[a].has_partial() || dst_dists[b].has_partial();
      CompareResult r;
      if (back.defined()) r = compare(back, global, arithmetic ? 1e-12 : 0, arithmetic ? 1e-12 : 0);
      if (!back.defined() || !r.equal) {
        o.failures.push_back(fmt::format("{} -> {} shape {}: {}\n{}", src_dists[a].to_string(), dst_dists[b].to_string(),
                                         shape.to_string(), back.defined() ? r.message : error,
                                         plans[a * nd + b].to_string()));
      }
      if (std::string idle = idle_step(plans[a * nd + b]); !idle.empty()) {
        o.failures.push_back(fmt::format("{} -> {} shape {}: {}\n{}", src_dists[a].to_string(), dst_dists[b].to_string(),
                                         shape.to_string(), idle, plans[a * nd + b].to_string()));
      }
      ++o.checked;
    }
  }
  return o;
}

Outcome check_all_pairs(const ProcessMesh& mesh, const Shape& shape, PlanOptions::Strategy strategy) {
  return check_all_pairs(mesh, mesh, static_cast<int>(mesh.size()), shape, strategy);
}

// Even (12 divides by 2, 3 and 4), uneven (5, 7), and dims smaller than the mesh (empty shards).
const Shape kShapes[] = {Shape{12, 6}, Shape{5, 7}, Shape{1, 3}};

struct Case {
  std::vector<int64_t> mesh;
  PlanOptions::Strategy strategy;
};

class EveryPair : public testing::TestWithParam<Case> {};

TEST_P(EveryPair, ReshardsToTheSameGlobalTensor) {
  ProcessMesh mesh{Shape(std::span<const int64_t>(GetParam().mesh))};
  for (const Shape& shape : kShapes) {
    Outcome o = check_all_pairs(mesh, shape, GetParam().strategy);
    EXPECT_TRUE(o.failures.empty()) << o.failures.size() << " of " << o.checked << " pairs failed; first:\n"
                                    << o.failures.front();
    EXPECT_GT(o.checked, 40);
  }
}

std::string name_of(const testing::TestParamInfo<Case>& info) {
  std::string s;
  for (int64_t d : info.param.mesh) s += (s.empty() ? "" : "x") + std::to_string(d);
  switch (info.param.strategy) {
    case PlanOptions::Strategy::Auto: return "mesh" + s + "_auto";
    case PlanOptions::Strategy::Collectives: return "mesh" + s + "_collectives";
    case PlanOptions::Strategy::Redistribute: return "mesh" + s + "_redistribute";
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, EveryPair,
    testing::Values(Case{{2}, PlanOptions::Strategy::Collectives}, Case{{2}, PlanOptions::Strategy::Redistribute},
                    Case{{4}, PlanOptions::Strategy::Collectives}, Case{{4}, PlanOptions::Strategy::Redistribute},
                    Case{{2, 2}, PlanOptions::Strategy::Collectives}, Case{{2, 2}, PlanOptions::Strategy::Redistribute},
                    Case{{2, 3}, PlanOptions::Strategy::Collectives}, Case{{2, 3}, PlanOptions::Strategy::Redistribute},
                    Case{{2, 3}, PlanOptions::Strategy::Auto}, Case{{1}, PlanOptions::Strategy::Auto},
                    Case{{1, 2}, PlanOptions::Strategy::Collectives}, Case{{1, 2}, PlanOptions::Strategy::Redistribute},
                    Case{{2, 1}, PlanOptions::Strategy::Auto}),
    name_of);

// Between meshes: disjoint process sets (pipeline stages), the same processes in another shape,
// overlapping sets, and same-shape meshes where Partial parts travel as they are.
TEST(BetweenMeshes, EveryPairReshardsToTheSameGlobalTensor) {
  auto ids = [](std::vector<int64_t> v) { return v; };
  struct Move {
    ProcessMesh from, to;
    int world;
  };
  std::vector<Move> moves = {
      {ProcessMesh(Shape{2}, ids({0, 1})), ProcessMesh(Shape{2}, ids({2, 3})), 4},
      {ProcessMesh(Shape{2, 2}), ProcessMesh(Shape{4}), 4},
      {ProcessMesh(Shape{2}, ids({0, 1})), ProcessMesh(Shape{3}, ids({1, 2, 3})), 4},
      {ProcessMesh(Shape{2, 2}, ids({0, 1, 2, 3})), ProcessMesh(Shape{2, 2}, ids({4, 5, 6, 7})), 8},
      {ProcessMesh(Shape{2, 3}, ids({0, 1, 2, 3, 4, 5})), ProcessMesh(Shape{2}, ids({5, 0})), 6},
  };
  for (const Move& mv : moves) {
    for (const Shape& shape : kShapes) {
      Outcome o = check_all_pairs(mv.from, mv.to, mv.world, shape, PlanOptions::Strategy::Auto);
      EXPECT_TRUE(o.failures.empty()) << mv.from.to_string() << " ranks " << fmt::format("{}", fmt::join(mv.from.process_ids(), ","))
                                      << " -> " << mv.to.to_string() << " ranks " << fmt::format("{}", fmt::join(mv.to.process_ids(), ","))
                                      << ": " << o.failures.size() << " of " << o.checked << " pairs failed; first:\n"
                                      << (o.failures.empty() ? "" : o.failures.front());
    }
  }
}

// Resharder::start (sharding stage 3's prefetch): every pair of Shard/Replicate distributions whose
// plan is one all-gather, started all at once and waited for in start order, gives the global tensor
// bit for bit; the gathers of dim 0 land in place, the others (dim 1, a co-shard's inner dim) are
// unpacked at the wait, and both kinds are among them.
TEST(StartedReshard, EveryOneAllGatherPlanGivesTheGlobalTensor) {
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{2}, {4}, {2, 2}, {2, 3}}) {
    const ProcessMesh mesh{Shape(std::span<const int64_t>(dims))};
    for (const Shape& shape : kShapes) {
      const std::vector<DistAttr> dists = every_dist(mesh.ndim(), false);
      Philox rng(7, stream_id("started"));
      const Tensor global = verify::random_tensor(shape, DType::F64, {}, rng);
      std::vector<std::pair<size_t, size_t>> pairs;
      std::vector<Plan> plans;
      std::set<int> gathered_dims;
      for (size_t a = 0; a < dists.size(); ++a) {
        for (size_t b = 0; b < dists.size(); ++b) {
          PlanOptions collectives;
          collectives.strategy = PlanOptions::Strategy::Collectives;
          Plan plan = plan_reshard(shape, DType::F64, {mesh, dists[a]}, {mesh, dists[b]}, {}, collectives);
          if (plan.steps.size() != 1 || plan.steps[0].kind != StepKind::AllGather) continue;
          pairs.emplace_back(a, b);
          gathered_dims.insert(plan.steps[0].tensor_dim);
          plans.push_back(std::move(plan));
        }
      }
      ASSERT_FALSE(plans.empty());
      EXPECT_EQ(gathered_dims, (std::set<int>{0, 1})) << mesh.to_string();
      std::vector<std::vector<Tensor>> results(plans.size(), std::vector<Tensor>(static_cast<size_t>(mesh.size())));
      comm::LocalWorld::run(static_cast<int>(mesh.size()), [&](comm::Communicator& c) {
        Resharder resharder(c.group(c.members()));
        std::vector<Tensor> inputs;  // alive until the waits
        std::vector<std::unique_ptr<StartedReshard>> started;
        for (size_t i = 0; i < plans.size(); ++i) {
          ASSERT_TRUE(resharder.can_start(plans[i]));
          inputs.push_back(verify::distribute(global, dists[pairs[i].first], mesh, Philox(1, 1))[static_cast<size_t>(c.rank())]);
          started.push_back(resharder.start(plans[i], inputs.back()));
        }
        for (size_t i = 0; i < plans.size(); ++i) results[i][static_cast<size_t>(c.rank())] = started[i]->wait();
      });
      for (size_t i = 0; i < plans.size(); ++i) {
        std::string error;
        Tensor back = verify::assemble(results[i], shape, DType::F64, dists[pairs[i].second], mesh, error);
        ASSERT_TRUE(back.defined()) << error;
        EXPECT_TRUE(compare(back, global, 0, 0).equal)
            << dists[pairs[i].first].to_string() << " -> " << dists[pairs[i].second].to_string() << " " << shape.to_string();
      }
    }
  }
}

}  // namespace
}  // namespace shardwise::reshard
