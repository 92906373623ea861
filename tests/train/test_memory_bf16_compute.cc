// What a micro-batch's frame keeps for its backward under bf16 compute (`train --compute bf16`):
// the GEMMs' bf16 operands, not their f32 sources. The memory plan against the runtime's measured
// activations, and the bf16 frames against the f32 ones.
#include <gtest/gtest.h>

#include "shardwise/comm/local.h"
#include "shardwise/ops/op.h"
#include "shardwise/train/memory_plan.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

std::vector<int64_t> measured_activations(const TrainConfig& c) {
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  std::vector<int64_t> out(static_cast<size_t>(ranks));
  comm::LocalWorld::run(ranks, [&](comm::Communicator& world) {
    Trainer t(c, world.group(world.members()));
    t.step();
    out[static_cast<size_t>(world.rank())] = t.held_bytes().activations;
  });
  return out;
}

MemoryPlan plan_of(TrainConfig c) {
  c.check(mesh::parse_mesh(c.parallel.mesh).size(), false);
  return plan_memory(c, true);
}

// A cast's gradient is the incoming gradient cast back to the input's dtype: it reads neither the
// input's values (its stand-in carries the dtype) nor the output's. Before, it read its input, so
// every f32 activation cast to bf16 for a GEMM was kept beside its bf16 copy until the backward.
TEST(Bf16ComputeMemory, TheCastsGradientReadsNoForwardTensor) {
  const ops::OpDef& cast = ops::op_registry().get("cast");
  const Attrs to_bf16{{"dtype", std::string("bf16")}};
  EXPECT_FALSE(cast.backward_reads_value(0, to_bf16));  // the input
  EXPECT_FALSE(cast.backward_reads_value(1, to_bf16));  // the output
}

// Llama with bf16 parameters on two pipeline stages, four micro-batches in flight: under bf16
// compute each frame keeps the GEMMs' bf16 operands and no f32 copy of them or of a weight (the
// bf16 GEMMs read the stored bf16 weights, so their f32 casts are never run). The plan equals the
// measured frames, and they are smaller than an f32-compute run's, whose frames keep f32 weight
// copies and f32 GEMM inputs. Before, the bf16 run's frames were the larger: the f32 sources of the
// casts were kept for the cast's gradient and the unread f32 weight casts ran and stayed.
TEST(Bf16ComputeMemory, FramesKeepTheBf16OperandsAndNoF32CopiesOfThem) {
  for (const char* recompute : {"none", "selective"}) {
    TrainConfig c = llama_test_config("pp=2", 1);
    c.model.layers = 4, c.model.recompute = recompute;
    c.bf16 = true;
    c.optimizer.global_batch = 8, c.optimizer.accumulation = 4;
    const MemoryPlan f32 = plan_of(c);
    c.model.compute_dtype = DType::BF16;
    const MemoryPlan bf16 = plan_of(c);
    const std::vector<int64_t> got = measured_activations(c);
    for (size_t r = 0; r < got.size(); ++r) {
      SCOPED_TRACE(fmt::format("recompute {} rank {}: bf16 compute plan {} measured {}, f32 compute plan {}", recompute,
                               r, bf16.ranks[r].activations, got[r], f32.ranks[r].activations));
      EXPECT_EQ(bf16.ranks[r].activations, got[r]);
      EXPECT_LT(bf16.ranks[r].activations, f32.ranks[r].activations);
    }
  }
}

// Sequence parallelism on tp=2 under bf16 compute: each norm output is cast to bf16 on its
// sequence shard, the bf16 copy all-gathered for the column-parallel matmuls and gathered again in
// the backward, so no frame keeps a whole-sequence copy of a matmul input. The plan equals the
// measured frames, and they keep less of the tp=2 run's without sp than before (Llama 0.667 of it,
// GPT-2 0.793, which keeps each bf16 shard: LayerNorm's gradient keeps no f32 output to cast
// again; before, keeping each layer's two gathered bf16 inputs whole: Llama 0.768, GPT-2 0.854).
TEST(Bf16ComputeMemory, SequenceParallelKeepsNoGatheredMatmulInput) {
  for (const auto& [model, at_most] : {std::pair{"llama", 0.7}, std::pair{"gpt2", 0.82}}) {
    TrainConfig c = std::string(model) == "llama" ? llama_test_config("tp=2", 1) : small_config("tp=2", 1);
    c.model.layers = 4, c.bf16 = true, c.model.compute_dtype = DType::BF16;
    const MemoryPlan whole = plan_of(c);
    c.parallel.sequence_parallel = true;
    const MemoryPlan sp = plan_of(c);
    const std::vector<int64_t> got = measured_activations(c);
    for (size_t r = 0; r < got.size(); ++r) {
      SCOPED_TRACE(fmt::format("{} rank {}: sp plan {} measured {}, without sp {}", model, r, sp.ranks[r].activations,
                               got[r], whole.ranks[r].activations));
      EXPECT_EQ(sp.ranks[r].activations, got[r]);
      EXPECT_LE(static_cast<double>(sp.ranks[r].activations), at_most * static_cast<double>(whole.ranks[r].activations));
    }
  }
}

}  // namespace
}  // namespace shardwise::train
