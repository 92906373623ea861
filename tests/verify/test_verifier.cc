// The verifier must accept right rules and catch wrong ones. These toy ops and rules are defined
// here, independent of the registered ones, so each mistake is deliberate and known.
#include <gtest/gtest.h>

#include <cmath>

#include "shardwise/spmd/einsum.h"
#include "shardwise/verify/verifier.h"

namespace shardwise::verify {
namespace {

using mesh::DistAttr;
using mesh::Placement;
using mesh::ReduceOp;
using spmd::SpmdResult;
using spmd::TensorSpec;

// Verifies `op` holding `rule` (a right or a deliberately wrong one).
Report verify_with(ops::OpDef op, const VerifyOptions& options, const spmd::Rule& rule) {
  op.rule = rule;
  return verify_op(op, options);
}

std::vector<ops::VerifyCase> toy_cases(int rank) {
  if (rank == 1) return {{{Shape{12}}, {DType::F64}, {}, {}}, {{Shape{5}}, {DType::F64}, {}, {}}};
  return {{{Shape{12, 6}}, {DType::F64}, {}, {}}, {{Shape{5, 2}}, {DType::F64}, {}, {}}};
}

// y = f(x) elementwise, with f and f' given.
ops::OpDef unary_op(std::string name, double (*f)(double), double (*df)(double)) {
  ops::OpDef op;
  op.name = name;
  op.family = "toy";
  op.infer = [](std::span<const ops::TensorMeta> in, const Attrs&) { return std::vector<ops::TensorMeta>{in[0]}; };
  op.forward = [f](std::span<const Tensor> in, const Attrs&) {
    Tensor y = in[0].clone();
    for (int64_t i = 0; i < y.numel(); ++i) y.set_at(i, f(in[0].at(i)));
    return std::vector<Tensor>{y};
  };
  op.backward = [df](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dy, const Attrs&) {
    Tensor dx = in[0].clone();
    for (int64_t i = 0; i < dx.numel(); ++i) dx.set_at(i, dy[0].at(i) * df(in[0].at(i)));
    return std::vector<Tensor>{dx};
  };
  op.cases = toy_cases(2);
  return op;
}

// Keeps shards; Partial mesh dims in `passes` stay Partial, others become Replicate.
spmd::Rule elementwise_rule(std::vector<ReduceOp> passes) {
  auto keep = [passes](const DistAttr& d) {
    DistAttr out = d;
    for (int m = 0; m < d.mesh_ndim(); ++m) {
      if (!d[m].is_partial()) continue;
      bool ok = std::find(passes.begin(), passes.end(), d[m].reduce) != passes.end();
      if (!ok) out.set(m, Placement::replicate());
    }
    return out;
  };
  spmd::Rule rule;
  rule.name = "toy";
  rule.forward = [keep](const mesh::ProcessMesh&, std::span<const TensorSpec> in, const Attrs&) {
    DistAttr d = keep(in[0].dist);
    return SpmdResult{{d}, {d}};
  };
  rule.reverse = [keep](const mesh::ProcessMesh&, std::span<const TensorSpec>, std::span<const TensorSpec> out,
                        const Attrs&) {
    DistAttr d = keep(out[0].dist);
    return SpmdResult{{d}, {d}};
  };
  // grad inputs: x, y, dy. Follow x's shards; Replicate everything that is not sharded there.
  rule.grad = [](const mesh::ProcessMesh&, std::span<const TensorSpec> in, const Attrs&) {
    DistAttr d(in[0].dist.mesh_ndim());
    for (int m = 0; m < d.mesh_ndim(); ++m) {
      if (in[0].dist[m].is_shard()) d.set(m, in[0].dist[m]);
    }
    return SpmdResult{{d, d, d}, {d}};
  };
  return rule;
}

VerifyOptions small() {
  VerifyOptions o;
  o.max_failures_per_op = 2;
  return o;
}

TEST(Verifier, AcceptsACorrectLinearRule) {
  ops::OpDef twice = unary_op("twice", [](double x) { return 2 * x; }, [](double) { return 2.0; });
  spmd::Rule rule = elementwise_rule({ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min});
  Report r = verify_with(twice, small(), rule);
  EXPECT_TRUE(r.ok()) << r.table();
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[3].mesh, "[2,3]");
  // 2 cases x (1 + 2 shard dims + 4 partial kinds)^2 mesh dims.
  EXPECT_EQ(r.rows[3].forward, 2 * 49);
  EXPECT_TRUE(r.rows[3].even && r.rows[3].uneven && r.rows[3].empty_shards);
}

TEST(Verifier, CatchesPartialSumPassedThroughANonlinearOp) {
  ops::OpDef exp_op = unary_op("toy_exp", [](double x) { return std::exp(x); }, [](double x) { return std::exp(x); });
  spmd::Rule right = elementwise_rule({});
  EXPECT_TRUE(verify_with(exp_op, small(), right).ok());
  spmd::Rule wrong = elementwise_rule({ReduceOp::Sum});  // exp(a + b) != exp(a) + exp(b)
  Report r = verify_with(exp_op, small(), wrong);
  EXPECT_FALSE(r.ok());
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures[0].message.find("differs from the single-device result"), std::string::npos)
      << r.failures[0].message;
}

TEST(Verifier, CatchesPartialMaxThroughADecreasingOp) {
  // neg turns a max into a min: passing P(max) through unchanged is wrong.
  ops::OpDef neg = unary_op("toy_neg", [](double x) { return -x; }, [](double) { return -1.0; });
  spmd::Rule wrong = elementwise_rule({ReduceOp::Sum, ReduceOp::Max});
  Report r = verify_with(neg, small(), wrong);
  EXPECT_FALSE(r.ok());
  for (const Failure& f : r.failures) EXPECT_NE(f.inputs.find("P(max)"), std::string::npos) << f.inputs;
}

TEST(Verifier, CatchesAWrongGradientRule) {
  ops::OpDef sq = unary_op("toy_square", [](double x) { return x * x; }, [](double x) { return 2 * x; });
  spmd::Rule rule = elementwise_rule({});
  // Claim the gradient is Partial(sum) on every mesh dim while every rank computes it whole.
  rule.grad = [](const mesh::ProcessMesh& m, std::span<const TensorSpec> in, const Attrs&) {
    DistAttr r(m.ndim()), p(m.ndim());
    for (int d = 0; d < m.ndim(); ++d) p.set(d, Placement::partial());
    return SpmdResult{{r, r, r}, {p}};
  };
  VerifyOptions o = small();
  o.forward = o.reverse = false;
  Report r = verify_with(sq, o, rule);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.failures[0].part, "grad");
}

// y[i] = sum_j x[i, j]: a sharded reduced dim yields Partial(sum).
ops::OpDef row_sum() {
  ops::OpDef op;
  op.name = "toy_rowsum";
  op.infer = [](std::span<const ops::TensorMeta> in, const Attrs&) {
    return std::vector<ops::TensorMeta>{{Shape{in[0].shape[0]}, in[0].dtype}};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs&) {
    Tensor y(in[0].dtype(), Shape{in[0].shape()[0]});
    int64_t n = in[0].shape()[1];
    for (int64_t i = 0; i < y.numel(); ++i) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += in[0].at(i * n + j);
      y.set_at(i, s);
    }
    return std::vector<Tensor>{y};
  };
  op.cases = toy_cases(2);
  return op;
}

spmd::Rule row_sum_rule(bool reduced_dim_partial) {
  spmd::Rule rule;
  rule.name = "toy";
  rule.forward = [reduced_dim_partial](const mesh::ProcessMesh& m, std::span<const TensorSpec> in, const Attrs&) {
    DistAttr x(m.ndim()), y(m.ndim());
    for (int d = 0; d < m.ndim(); ++d) {
      const Placement& p = in[0].dist[d];
      if (p.is_shard(0)) {
        x.set(d, p);
        y.set(d, Placement::shard(0));
      } else if (p.is_shard(1)) {
        x.set(d, p);
        if (reduced_dim_partial) y.set(d, Placement::partial());  // the wrong rule leaves it R
      }
    }
    return SpmdResult{{x}, {y}};
  };
  rule.reverse = [](const mesh::ProcessMesh& m, std::span<const TensorSpec>, std::span<const TensorSpec>,
                    const Attrs&) { return SpmdResult{{DistAttr(m.ndim())}, {DistAttr(m.ndim())}}; };
  rule.grad = rule.forward;
  return rule;
}

TEST(Verifier, CatchesAReductionThatForgetsThePartialSum) {
  ops::OpDef op = row_sum();
  spmd::Rule right = row_sum_rule(true);
  Report ok = verify_with(op, small(), right);
  EXPECT_TRUE(ok.ok()) << ok.table();
  spmd::Rule wrong = row_sum_rule(false);
  Report bad = verify_with(op, small(), wrong);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.failures[0].message.find("replicas"), std::string::npos) << bad.failures[0].message;
}

TEST(Verifier, CatchesAClaimedShardThatTheKernelDoesNotProduce) {
  ops::OpDef op = unary_op("toy_id", [](double x) { return x; }, [](double) { return 1.0; });
  spmd::Rule rule = elementwise_rule({});
  rule.forward = [](const mesh::ProcessMesh& m, std::span<const TensorSpec>, const Attrs&) {
    DistAttr r(m.ndim()), s(m.ndim());
    s.set(0, Placement::shard(0));
    return SpmdResult{{r}, {s}};  // inputs replicated, output claimed sharded
  };
  Report bad = verify_with(op, small(), rule);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.failures[0].message.find("give it"), std::string::npos) << bad.failures[0].message;
}

// y[i, j] = x[i, j] + (global flat index of (i, j)): right on a shard only if the kernel reads
// its shard's global offset from the context.
ops::OpDef plus_global_index(bool use_offsets) {
  ops::OpDef op = unary_op("toy_index", [](double x) { return x; }, [](double) { return 1.0; });
  op.forward = nullptr;
  op.forward_in_context = [use_offsets](std::span<const Tensor> in, const Attrs&, const ops::KernelContext& ctx) {
    const ops::ShardInfo& info = ctx.tensors[0];
    Tensor y = in[0].clone();
    int64_t cols = in[0].shape()[1];
    for (int64_t i = 0; i < y.numel(); ++i) {
      int64_t gi = i / std::max<int64_t>(cols, 1) + (use_offsets ? info.offset[0] : 0);
      int64_t gj = i % std::max<int64_t>(cols, 1) + (use_offsets ? info.offset[1] : 0);
      y.set_at(i, in[0].at(i) + static_cast<double>(gi * info.global_shape[1] + gj));
    }
    return std::vector<Tensor>{y};
  };
  return op;
}

TEST(Verifier, PassesShardOffsetsToContextKernels) {
  spmd::Rule rule = elementwise_rule({});
  VerifyOptions o = small();
  o.grad = false;
  EXPECT_TRUE(verify_with(plus_global_index(true), o, rule).ok());
  EXPECT_FALSE(verify_with(plus_global_index(false), o, rule).ok());
}

// y[i, j] = x[i, j] - sum_i' x[i', j]: with dim 0 sharded the kernel must all-reduce the local
// column sums over the mesh dims that shard dim 0 (a collective kernel, run as threads).
ops::OpDef minus_column_sum(bool all_reduce) {
  ops::OpDef op = unary_op("toy_colsum", [](double x) { return x; }, [](double) { return 1.0; });
  op.forward = nullptr;
  op.collective = true;
  op.forward_in_context = [all_reduce](std::span<const Tensor> in, const Attrs&, const ops::KernelContext& ctx) {
    const Tensor& x = in[0];
    int64_t rows = x.shape()[0], cols = x.shape()[1];
    Tensor sums(DType::F64, Shape{cols});
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) sums.set_at(j, sums.at(j) + x.at(i * cols + j));
    }
    mesh::MeshDimList dims = ctx.tensors[0].dist.mesh_dims_of(0);
    if (all_reduce && ctx.mesh_comm && !dims.empty()) {
      std::vector<int> mesh_dims(dims.begin(), dims.end());
      ctx.mesh_comm->along(mesh_dims).all_reduce(sums, comm::Reduce::Sum);
    }
    Tensor y = x.clone();
    for (int64_t i = 0; i < y.numel(); ++i) y.set_at(i, x.at(i) - sums.at(i % cols));
    return std::vector<Tensor>{y};
  };
  return op;
}

TEST(Verifier, RunsCollectiveKernelsAsThreads) {
  spmd::Rule rule = elementwise_rule({});
  VerifyOptions o = small();
  o.grad = false;
  Report right = verify_with(minus_column_sum(true), o, rule);
  EXPECT_TRUE(right.ok()) << right.table();
  Report wrong = verify_with(minus_column_sum(false), o, rule);
  EXPECT_FALSE(wrong.ok());
}

}  // namespace
}  // namespace shardwise::verify
