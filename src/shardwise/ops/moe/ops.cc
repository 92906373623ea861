// The moe family's registry entry: moe_mlp (kernels in kernels.h, rule in rules.cc), one op for
// router, dispatch, experts and combine. One op rather than four: the dispatch plan (who sends
// which rows where) and the routing it comes from are recomputed in backward from x and the gate
// alone, so no op boundary would carry more than x; split ops would have to pass the plan and
// the expert-major rows between them as tensors of data-dependent size.
//
// Attributes: top_k (int, required), capacity_factor (float >= 0, default 0: dropless),
// normalize (bool, default true: renormalise the top-k weights), router ("softmax" or "sigmoid").
#include "shardwise/core/error.h"
#include "shardwise/ops/families.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/ops/moe/rules.h"

namespace shardwise::ops {

namespace {

constexpr std::string_view kMoe = "moe_mlp";

std::vector<Tensor> forward(std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
  return moe_forward(in, moe_config(attrs, in[1].shape()[0]), moe_shard_of(ctx));
}

std::vector<Tensor> backward(std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                             const Attrs& attrs, const KernelContext& ctx) {
  MoeGrads g = moe_backward(in, dout[0], dout[1], dout[2], moe_config(attrs, in[1].shape()[0]), moe_shard_of(ctx));
  return {g.dx, g.dgate, g.dw1, g.dw3, g.dw2};
}

VerifyCase moe_case(int64_t n, int64_t d, int64_t e, int64_t f, int64_t k, double capacity, DType dtype,
                    bool normalize = true, bool sigmoid = false) {
  Attrs a{{"top_k", k}};
  if (capacity > 0) a.set("capacity_factor", capacity);
  if (!normalize) a.set("normalize", false);
  if (sigmoid) a.set("router", std::string("sigmoid"));
  return VerifyCase{{{n, d}, {e, d}, {e, f, d}, {e, f, d}, {e, d, f}},
                    {dtype, dtype, dtype, dtype, dtype},
                    std::move(a),
                    {}};
}

// 12 tokens with 6 experts divide [2], [3], [2,3]; 12 everywhere (every dim, co-sharded too); 5 tokens / 4 experts and 7 / 5 do not;
// 2 tokens over 3 experts with top_k 1 leave an expert without tokens and token shards empty on
// [3] and [2,3] (ranks that send nothing); 1 token leaves empty shards everywhere. Capacity
// cases drop assignments (dropped > 0); one f32 case without renormalisation. Skewed: a constant
// gate ties every expert, so every token picks experts 0 and 1 (the lower index wins a tie): the
// ranks holding the other experts receive nothing, and with capacity 0.5 those two drop half. One
// sigmoid-gated case with capacity. One bf16 case (--compute bf16: bf16 x and experts, f32 gate;
// f32 out and losses), uneven with capacity.
std::vector<VerifyCase> moe_cases() {
  const DType f64 = DType::F64;
  VerifyCase skewed = moe_case(6, 3, 4, 2, 2, 0.0, f64), skewed_capacity = moe_case(6, 3, 4, 2, 2, 0.5, f64);
  skewed.values = skewed_capacity.values = {ValueGen{}, ValueGen{ValueGen::Kind::Uniform, 0.5, 0.5}};
  VerifyCase bf16 = moe_case(5, 3, 4, 2, 2, 0.75, DType::BF16);
  bf16.dtypes[1] = DType::F32;
  return {bf16,
      skewed, skewed_capacity,
      moe_case(12, 4, 6, 3, 2, 0.0, f64),   moe_case(5, 3, 4, 2, 2, 0.75, f64), moe_case(2, 3, 3, 2, 1, 0.0, f64),
      moe_case(1, 2, 2, 2, 1, 1.0, f64),    moe_case(12, 12, 12, 12, 3, 0.5, f64),
      moe_case(7, 4, 5, 3, 2, 0.0, DType::F32, false),  moe_case(12, 4, 6, 3, 2, 0.75, f64, true, true),
  };
}

OpDef make_moe_mlp() {
  OpDef op;
  op.name = std::string(kMoe);
  op.family = "moe";
  op.rule = rules_of<moe_rules>().moe_mlp;
  op.summary =
      "(out, aux_loss, z_loss, dropped, expert_tokens) = moe_mlp(x [N, d], gate [E, d], w1 [E, F, d], w3 [E, F, d], w2 [E, d, F]; "
      "top_k, capacity_factor=0, normalize=true, router=softmax): Mixtral's sparse MoE MLP (softmax over E, or sigmoid "
      "scores, top-k, renormalise; "
      "SwiGLU experts w2(silu(w1 x) * w3 x)); aux_loss = E sum_i f_i P_i, z_loss = mean logsumexp^2; capacity "
      "C = ceil(cf N k / E) per expert by (slot, token) priority, dropped counted (i64); expert_tokens [E] i64 the "
      "assignments per expert before capacity. Experts split over mesh "
      "dims exchange tokens by all_to_all_v";
  op.num_inputs = 5;
  op.num_outputs = 5;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    std::array<DType, 5> dtypes{in[0].dtype, in[1].dtype, in[2].dtype, in[3].dtype, in[4].dtype};
    check_moe_inputs(in[0].shape, in[1].shape, in[2].shape, in[3].shape, in[4].shape, dtypes);
    moe_config(attrs, in[1].shape[0]);
    const DType out = moe_output_dtype(in[0].dtype);
    return std::vector<TensorMeta>{{in[0].shape, out},
                                   {Shape{}, out},
                                   {Shape{}, out},
                                   {Shape{}, DType::I64},
                                   {Shape{in[1].shape[0]}, DType::I64}};
  };
  op.forward_in_context = forward;
  op.backward_in_context = backward;
  op.collective = true;
  op.backward_reads = std::vector<int>{0, 1, 2, 3, 4};  // the inputs; the routing is recomputed
  op.cases = moe_cases();
  return op;
}

}  // namespace

// Where this rank's blocks sit (ctx.tensors: x at 0, w1 at 2, forward and backward alike) and its
// groups; the expert-sharding mesh dims must also split the tokens.
MoeShard moe_shard_of(const KernelContext& ctx) {
  MoeShard s;
  if (ctx.tensors.size() < 5 || ctx.tensors[0].global_shape.ndim() != 2) return s;
  s.token_offset = ctx.tensors[0].offset[0];
  s.tokens_total = ctx.tensors[0].global_shape[0];
  s.expert_offset = ctx.tensors[2].offset[0];
  s.token_group = ctx.group_sharding(0, 1u, kMoe);
  s.expert_group = ctx.group_sharding(2, 1u, kMoe);
  const mesh::MeshDimList tokens = ctx.tensors[0].dist.mesh_dims_of(0);
  for (int8_t m : ctx.tensors[2].dist.mesh_dims_of(0)) {
    SW_CHECK(tokens.contains(m),
             "{}: the experts are split over mesh dim {} but the tokens are not (x {}, w1 {}); split x's token dim "
             "there too",
             kMoe, m, ctx.tensors[0].dist.to_string(), ctx.tensors[2].dist.to_string());
  }
  return s;
}

MoeShard moe_device_shard_of(const KernelContext* ctx) {
  MoeShard s = ctx ? moe_shard_of(*ctx) : MoeShard{};
  for (comm::Communicator** group : {&s.token_group, &s.expert_group}) {
    if (*group && (*group)->size() == 1) *group = nullptr;
  }
  return s;
}

void register_moe_ops(OpRegistry& registry) { registry.add(make_moe_mlp()); }

}  // namespace shardwise::ops
