// The reshard executor and the runtime over MPI: 4 processes as a [2,2] mesh (ctest runs this
// under mpirun -np 4). References are computed independently in each process: the verifier's
// cut/assemble for reshards, a single-device run for the model.
#include <gtest/gtest.h>

#include "../runtime/harness.h"
#include "../runtime/transformer_block.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/graph/completion.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise {
namespace {

using mesh::DistAttr;
using mesh::Placement;

std::vector<DistAttr> every_dist_2d() {
  std::vector<Placement> options = {Placement::replicate(), Placement::shard(0), Placement::shard(1),
                                    Placement::partial(mesh::ReduceOp::Sum), Placement::partial(mesh::ReduceOp::Avg),
                                    Placement::partial(mesh::ReduceOp::Max), Placement::partial(mesh::ReduceOp::Min)};
  std::vector<DistAttr> out;
  for (const Placement& a : options) {
    for (const Placement& b : options) {
      out.push_back(DistAttr{a, b});
      if (a.is_shard() && a == b) {
        DistAttr r{a, b};
        int8_t reversed[] = {1, 0};
        r.set_shard_order(a.dim, reversed);
        out.push_back(r);
      }
    }
  }
  return out;
}

// Every rank's local tensor, shared with every rank (through all_gather_bytes, not the reshard).
std::vector<Tensor> gather_locals(comm::Communicator& world, const Tensor& mine, const Shape& global,
                                  const DistAttr& dist, const mesh::ProcessMesh& mesh) {
  auto bytes = world.all_gather_bytes(std::span<const std::byte>(mine.raw(), mine.nbytes()));
  std::vector<Tensor> out;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    Tensor t(mine.dtype(), mesh::local_shape(global, dist, mesh, mesh.coords(r)));
    if (t.nbytes()) std::memcpy(t.raw(), bytes[static_cast<size_t>(r)].data(), t.nbytes());
    out.push_back(t);
  }
  return out;
}

TEST(MpiReshard, EveryPairOn2x2EqualsTheGlobalTensor) {
  auto world = comm::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpirun -np 4";
  mesh::ProcessMesh mesh(Shape{2, 2});
  reshard::Resharder resharder(world);
  std::vector<DistAttr> dists = every_dist_2d();
  int failures = 0, checked = 0;
  for (Shape shape : {Shape{12, 6}, Shape{5, 3}}) {
    Tensor global = verify::random_tensor(shape, DType::F64, {}, Philox(5, stream_id("mpi-reshard")));
    for (const DistAttr& from : dists) {
      Tensor mine = verify::distribute(global, from, mesh, Philox(9, stream_id(from.to_string())))[static_cast<size_t>(world->rank())];
      for (const DistAttr& to : dists) {
        reshard::Plan plan = reshard::plan_reshard(shape, DType::F64, {mesh, from}, {mesh, to});
        Tensor out = resharder.run(plan, mine);
        std::string error;
        Tensor back = verify::assemble(gather_locals(*world, out, shape, to, mesh), shape, DType::F64, to, mesh, error);
        bool arithmetic = from.has_partial() || to.has_partial();
        CompareResult c = back.defined() ? compare(back, global, arithmetic ? 1e-12 : 0, arithmetic ? 1e-12 : 0) : CompareResult{};
        ++checked;
        if (!back.defined() || !c.equal) {
          if (++failures <= 3) ADD_FAILURE() << from.to_string() << " -> " << to.to_string() << " " << shape.to_string() << ": " << (back.defined() ? c.message : error) << "\n" << plan.to_string();
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << "of " << checked;
  EXPECT_GT(checked, 5000);
}

TEST(MpiRuntime, GptBlockOnDp2Tp2EqualsTheSingleDeviceRun) {
  auto world = comm::mpi_world();
  testing_support::BlockConfig cfg;
  cfg.vocab_parallel_loss = true;
  auto data = testing_support::block_data(cfg);
  std::map<std::string, std::string> placements = {{"ids", "S(0),R"}, {"labels", "S(0),R"}};
  for (const char* col : {"q", "k", "v", "fc1"}) {
    placements[std::string(col) + ".weight"] = "R,S(1)";
    placements[std::string(col) + ".bias"] = "R,S(0)";
  }
  placements["attn_out.weight"] = "R,S(0)";
  placements["fc2.weight"] = "R,S(0)";
  placements["wte"] = "R,S(0)";
  auto ref = testing_support::run_graph([&](graph::Graph& g) { build_block(g, cfg, {}); }, mesh::ProcessMesh(Shape{1}),
                                        data, "loss", {"loss", "x2"});
  graph::Graph g;
  build_block(g, cfg, placements);
  graph::append_backward(g, g.get("loss"));
  mesh::ProcessMesh mesh(Shape{2, 2}, {}, {"dp", "tp"});
  graph::Program p = graph::lower(g, graph::complete(g, mesh));
  runtime::Runtime rt(g, p, world);
  for (const auto& [name, t] : data) rt.set_global(name, t);
  rt.keep("x2");
  rt.keep("loss");
  rt.run();
  for (const char* name : {"loss", "x2"}) {
    CompareResult c = compare(rt.gather(name), ref.values.at(name), 2e-5, 2e-6);
    EXPECT_TRUE(c.equal) << name << ": " << c.message;
  }
  for (const auto& [name, t] : ref.grads) {
    CompareResult c = compare(rt.gather_grad(name), t, 2e-5, 2e-6);
    EXPECT_TRUE(c.equal) << "gradient of " << name << ": " << c.message;
  }
  EXPECT_GT(rt.stats().bytes_sent, 0);
}

}  // namespace
}  // namespace shardwise
