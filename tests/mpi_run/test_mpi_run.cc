// The reshard executor and the runtime over MPI: 4 processes as a [2,2] mesh (ctest runs this
// under mpirun -np 4). References are computed independently in each process: the verifier's
// cut/assemble for reshards, a single-device run for the model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../runtime/harness.h"
#include "../runtime/transformer_block.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/graph/completion.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/moe/kernels.h"
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

// The MoE kernel with tokens and experts split over the 4 processes (one expert each; its two
// exchanges skip the call checks: CheckedByCaller) against each process's one-rank run, forward
// and backward; then a process that calls another collective while the others run the kernel
// makes every process raise the same Error at the kernel's first (checked) collective.
TEST(MpiMoe, ExpertParallelEqualsOneRankAndAMismatchedCallIsAnError) {
  auto world = comm::mpi_world();
  const int n = world->size(), me = world->rank();
  const int64_t tokens = 6, d = 4, f = 3;  // tokens a rank
  auto filled = [](Shape shape, double scale, int seed) {
    Tensor t(DType::F64, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = scale * std::sin(0.7 * static_cast<double>(i) + seed);
    return t;
  };
  Tensor x = filled(Shape{tokens * n, d}, 1.0, 1), gate = filled(Shape{n, d}, 0.8, 2);
  Tensor w1 = filled(Shape{n, f, d}, 0.5, 3), w3 = filled(Shape{n, f, d}, 0.5, 4), w2 = filled(Shape{n, d, f}, 0.5, 5);
  Tensor dout = filled(Shape{tokens * n, d}, 1.0, 6);
  const ops::MoeConfig cfg{2, 0.0, true, false};
  std::vector<Tensor> all{x, gate, w1, w3, w2};
  const std::vector<Tensor> want = ops::moe_forward(all, cfg, ops::MoeShard{});
  const ops::MoeGrads want_grad = ops::moe_backward(all, dout, Tensor(), Tensor(), cfg, ops::MoeShard{});
  auto rows = [&](const Tensor& t) { return t.slice(std::vector<int64_t>{me * tokens, 0}, Shape{tokens, d}); };
  auto expert = [&](const Tensor& t) {
    return t.slice(std::vector<int64_t>{me, 0, 0}, Shape{1, t.shape()[1], t.shape()[2]});
  };
  std::vector<Tensor> mine{rows(x), gate, expert(w1), expert(w3), expert(w2)};
  const ops::MoeShard shard{me * tokens, n * tokens, me, world.get(), world.get()};
  const std::vector<Tensor> got = ops::moe_forward(mine, cfg, shard);
  const ops::MoeGrads grad = ops::moe_backward(mine, rows(dout), Tensor(), Tensor(), cfg, shard);
  const Tensor want_out = rows(want[0]), want_dx = rows(want_grad.dx), want_dw1 = expert(want_grad.dw1);
  for (int64_t i = 0; i < tokens * d; ++i) {
    EXPECT_NEAR(got[0].at(i), want_out.at(i), 1e-12) << i;
    EXPECT_NEAR(grad.dx.at(i), want_dx.at(i), 1e-12) << i;
  }
  for (int64_t i = 0; i < f * d; ++i) EXPECT_NEAR(grad.dw1.at(i), want_dw1.at(i), 1e-12) << i;
  EXPECT_NEAR(got[1].at(0), want[1].at(0), 1e-12);  // the aux loss, from the global sums
  std::string message = "no error";
  try {
    if (me == 0) ops::moe_forward(mine, cfg, shard);
    else world->all_reduce(dout, comm::Reduce::Sum);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("collective mismatch: rank 0 called all_gather while rank 1 called all_reduce"),
            std::string::npos)
      << message;
}

// The two exchanges of the MoE kernel on 4 processes (MoeExchange): by messages and through the
// node-shared window give the same bits, forward and backward, equal to each process's one-rank
// run; rank 1 holds no tokens (sends nothing) and expert 3 is never chosen (receives nothing).
TEST(MpiMoe, SharedAndMessageExchangesGiveTheSameBits) {
  auto world = comm::mpi_world();
  const int n = world->size(), me = world->rank();
  const int64_t d = 4, f = 3, tokens = 7;  // tokens a rank, but rank 1 holds none
  auto filled = [](Shape shape, double scale, int seed) {
    Tensor t(DType::F64, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = scale * std::sin(0.9 * static_cast<double>(i) + seed);
    return t;
  };
  Tensor x = filled(Shape{tokens * (n - 1), d}, 1.0, 1), gate = filled(Shape{n, d}, 0.8, 2);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = std::abs(x.data<double>()[i]) + 0.1;
  for (int64_t c = 0; c < d; ++c) gate.data<double>()[(n - 1) * d + c] = -10.0;  // the last expert: never chosen
  Tensor w1 = filled(Shape{n, f, d}, 0.5, 3), w3 = filled(Shape{n, f, d}, 0.5, 4), w2 = filled(Shape{n, d, f}, 0.5, 5);
  Tensor dout = filled(Shape{tokens * (n - 1), d}, 1.0, 6);
  const ops::MoeConfig cfg{2, 0.0, true, false};
  std::vector<Tensor> all{x, gate, w1, w3, w2};
  const std::vector<Tensor> want = ops::moe_forward(all, cfg, ops::MoeShard{});
  const ops::MoeGrads want_grad = ops::moe_backward(all, dout, Tensor(), Tensor(), cfg, ops::MoeShard{});
  const int64_t first = me <= 1 ? me * tokens : (me - 1) * tokens, count = me == 1 ? 0 : tokens;
  auto rows = [&](const Tensor& t) { return t.slice(std::vector<int64_t>{first, 0}, Shape{count, d}); };
  auto expert = [&](const Tensor& t) {
    return t.slice(std::vector<int64_t>{me, 0, 0}, Shape{1, t.shape()[1], t.shape()[2]});
  };
  std::vector<Tensor> mine{rows(x), gate, expert(w1), expert(w3), expert(w2)};
  std::vector<Tensor> got[2];
  for (int path = 0; path < 2; ++path) {
    const ops::MoeShard shard{first, tokens * (n - 1), me, world.get(), world.get(),
                              path == 0 ? ops::MoeExchange::Messages : ops::MoeExchange::Shared};
    const int64_t before = world->shared_regions(0).call;
    const std::vector<Tensor> out = ops::moe_forward(mine, cfg, shard);
    const ops::MoeGrads g = ops::moe_backward(mine, rows(dout), Tensor(), Tensor(), cfg, shard);
    EXPECT_EQ(world->shared_regions(0).call - before - 1, path == 0 ? 0 : 2) << "path " << path;
    got[path] = {out[0], g.dx, g.dgate, g.dw1, g.dw2, g.dw3};
  }
  for (size_t i = 0; i < got[0].size(); ++i) {
    EXPECT_TRUE(got[0][i].shape() == got[1][i].shape() &&
                std::memcmp(got[0][i].raw(), got[1][i].raw(), got[0][i].nbytes()) == 0)
        << "output " << i << " differs between the exchanges on rank " << me;
  }
  const Tensor want_out = rows(want[0]), want_dx = rows(want_grad.dx), want_dw1 = expert(want_grad.dw1);
  for (int64_t i = 0; i < count * d; ++i) {
    EXPECT_NEAR(got[1][0].at(i), want_out.at(i), 1e-12) << i;
    EXPECT_NEAR(got[1][1].at(i), want_dx.at(i), 1e-12) << i;
  }
  for (int64_t i = 0; i < f * d; ++i) EXPECT_NEAR(got[1][3].at(i), want_dw1.at(i), 1e-12) << i;
  if (me == n - 1) {
    for (int64_t i = 0; i < f * d; ++i) EXPECT_EQ(got[1][3].at(i), 0.0) << "the unchosen expert's gradient";
  }
}

}  // namespace
}  // namespace shardwise
