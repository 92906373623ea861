// Sharding stage 3 (FSDP, train/sharding.h's shards_params): parameters stored Shard over dp, each
// rank's parameters, gradients and moments its shards; every use all-gathers the parameter and the
// gathered copy goes after it (re-gathered for the backward), the gradient is reduce-scattered.
// Checked here: the layout and the ZeRO bytes, the collectives per parameter, the gathered bytes a
// step holds (measured by the runtime), the loss curves against plain dp, and checkpoints between
// every layout and mesh.
#include "tests/support/llama_config.h"
#include "shardwise/graph/prefetch.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/models/models.h"
#include "tests/support/sharding_runs.h"

namespace shardwise::train {
namespace {

using namespace sharding_test;

TrainConfig stage3(TrainConfig c, const std::string& recompute = "none") {
  c.parallel.sharding = {3, "v1"};
  c.model.recompute = recompute;
  return c;
}

// Bytes of the whole f32 parameter as the kernels read it on this rank: its block without the dp
// shard (the tp block).
int64_t gathered_bytes(const ParamState& p, int dp, const std::vector<int64_t>& coords) {
  mesh::DistAttr d = p.dist;
  d.set(dp, mesh::Placement::replicate());
  return 4 * mesh::local_shape(p.shape, d, p.mesh, coords).numel();
}

std::vector<int64_t> my_coords(const ParamState& p, int process) {
  return p.mesh.coords(p.mesh.rank_index_of_process(process));
}

// Each parameter is dp's Shard(0) after tp's shards of dim 0; the dp group holds every element of its
// blocks once: AdamW's state is the ZeRO stage-3 share, 8 bytes x Psi over dp=4, and over dp=2 x tp=2
// half what the unsharded ranks hold together (the tp replicas of norms and biases stay replicas).
TEST(ShardingStage3, ParametersAreDpShardsAndTheOptimizerStateIsEachElementOnce) {
  for (const std::string mesh : {"dp=4", "dp=2,tp=2"}) {
    TrainConfig c = stage3(small_config(mesh, 1));
    const int64_t psi = static_cast<int64_t>(parameter_count(c.model));
    int64_t unsharded = 0;
    for (int64_t b : train(small_config(mesh, 1), 0).optimizer_bytes) unsharded += b;
    std::vector<int64_t> bytes(4, 0);
    comm::LocalWorld::run(4, [&](comm::Communicator& w) {
      auto world = w.group(w.members());
      Trainer t(c, world);
      EXPECT_EQ(t.sharded(), nullptr);  // no ShardedOptimizer: the plain one updates the shards
      const int dp = t.strategy().dp;
      for (const ParamState& p : t.params()) {
        EXPECT_TRUE(p.dist[dp].is_shard(0)) << p.name << " " << p.dist.to_string();
        const mesh::MeshDimList order = p.dist.mesh_dims_of(0);
        EXPECT_EQ(order[order.size() - 1], dp) << p.name << ": dp splits the tp block, after tp";
        EXPECT_EQ(p.param.numel(), mesh::local_shape(p.shape, p.dist, p.mesh, my_coords(p, w.rank())).numel());
        EXPECT_EQ(p.exp_avg.numel(), p.param.numel()) << p.name;
      }
      bytes[static_cast<size_t>(w.rank())] = t.optimizer_state_bytes();
    });
    int64_t sum = 0;
    for (int64_t b : bytes) sum += b;
    EXPECT_EQ(sum * (mesh == "dp=4" ? 4 : 2), unsharded) << mesh;
    if (mesh == "dp=4") {
      EXPECT_EQ(sum, 8 * psi);
      // Each rank about a quarter: rows of dim 0 in 4 chunks, off by at most one row per parameter.
      for (int64_t b : bytes) EXPECT_NEAR(static_cast<double>(b), 2.0 * psi, 0.05 * 2.0 * psi) << mesh;
    }
  }
}

// Per parameter and micro-batch: one all-gather for each forward use, one for the backward (shared
// by the recompute copies and the gradient kernels of its layer), none where the gradient kernel
// reads only the shape (a bias add, the embedding lookup); one reduce-scatter of the gradient, run
// as soon as the gradient is complete (only reshards between the kernel making it and the
// reduce-scatter in the execution order), not after the whole backward. The fused LM head forms
// its gradients in its forward (the default), so its backward reads no weight and gathers none;
// with head_grads_in_forward off its backward recomputes them from a gathered weight.
TEST(ShardingStage3, EachParameterIsGatheredPerUseAndItsGradientReduceScatteredOnce) {
  for (const std::string recompute : {"none", "full", "selective", "none, head grads in the backward"}) {
    TrainConfig c = stage3(small_config("dp=2,tp=2", 1), recompute.substr(0, recompute.find(',')));
    c.model.head_grads_in_forward = recompute.find(',') == std::string::npos;
    comm::LocalWorld::run(4, [&](comm::Communicator& w) {
      auto world = w.group(w.members());
      Trainer t(c, world);
      if (w.rank() != 0) return;
      const pipeline::PipelineRunner& runner = t.stages().runner();
      const graph::Program& p = runner.compiled(0).program;
      const graph::Graph& g = *runner.spec(0).graph;
      const std::vector<graph::ValueId> params = g.params();
      const std::vector<int>& order = runner.compiled(0).order;
      auto position = [&](int instr) { return std::find(order.begin(), order.end(), instr) - order.begin(); };
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = g.value(params[i]).name;
        const int home = p.value_slot[static_cast<size_t>(params[i])];
        int gathers = 0, scatters = 0, produced_grad = 0;
        for (const graph::Instr& ins : p.instrs) {
          if (ins.kind != graph::InstrKind::Reshard) continue;
          for (const reshard::Step& s : ins.plan.steps) {
            if (ins.in[0] == home && s.kind == reshard::StepKind::AllGather) ++gathers;
            if (ins.out[0] == p.param_grad_slot[i] && s.kind == reshard::StepKind::ReduceScatter) ++scatters;
          }
          if (ins.out[0] != p.param_grad_slot[i]) continue;
          ++produced_grad;
          int made = -1;  // the instruction writing the full gradient the reduce-scatter reads
          for (size_t j = 0; j < p.instrs.size(); ++j)
            for (int o : p.instrs[j].out)
              if (o == ins.in[0]) made = static_cast<int>(j);
          const auto from = position(made), to = position(static_cast<int>(&ins - p.instrs.data()));
          ASSERT_LT(from, to) << name;
          for (auto k = from + 1; k < to; ++k)
            EXPECT_EQ(p.instrs[static_cast<size_t>(order[static_cast<size_t>(k)])].kind, graph::InstrKind::Reshard)
                << recompute << " " << name << ": a kernel runs between its gradient and the reduce-scatter";
        }
        // Biases enter through `add` and layer_norm's shift (their gradients read no bias), the
        // embedding tables through `embedding` (the lookup's gradient scatters dout by ids):
        // gathered for the forward only, and with full recompute once more for the layer's copies,
        // except the MLP's output bias: no gradient reads what its add makes, so it has no copy.
        // The tied embedding is also the head's weight: + the fused head's forward, and its
        // backward where that recomputes the gradients.
        const bool copied = layer_of_param(c.model, name) >= 0 && !name.ends_with("mlp.c_proj.bias");
        int want = 2;
        if (name.ends_with(".bias")) want = recompute == "full" && copied ? 2 : 1;
        if (name == "transformer.wpe.weight") want = 1;
        if (name == "transformer.wte.weight") want = c.model.head_grads_in_forward ? 2 : 3;
        EXPECT_EQ(gathers, want) << recompute << " " << name;
        EXPECT_EQ(scatters, 1) << recompute << " " << name;
        EXPECT_EQ(produced_grad, 1) << recompute << " " << name;
      }
    });
  }
}

// The point of stage 3: the runtime's measured peak of gathered parameter copies during a step is
// about one layer's parameters (whole over dp, tp blocks), far from the whole model's; without the
// frees it would be every parameter's.
TEST(ShardingStage3, AStepHoldsAboutOneLayersGatheredParametersAtOnce) {
  for (const std::string recompute : {"none", "full"}) {
    TrainConfig c = stage3(small_config("dp=2", 2), recompute);
    c.model.layers = 4;
    std::vector<int64_t> peak(2), largest_group(2), largest_param(2), all(2);
    comm::LocalWorld::run(2, [&](comm::Communicator& w) {
      auto world = w.group(w.members());
      Trainer t(c, world);
      t.step();
      const size_t r = static_cast<size_t>(w.rank());
      peak[r] = t.stages().last_stats().peak_gathered_bytes;
      std::map<int64_t, int64_t> by_layer;  // layer -> gathered bytes; -1 - k: the k-th non-layer parameter alone
      int64_t k = 0;
      for (const ParamState& p : t.params()) {
        const int64_t b = gathered_bytes(p, t.strategy().dp, my_coords(p, w.rank()));
        const int64_t layer = layer_of_param(c.model, p.name);
        by_layer[layer >= 0 ? layer : -1 - k++] += b;
        largest_param[r] = std::max(largest_param[r], b);
        all[r] += b;
      }
      for (const auto& [layer, b] : by_layer) largest_group[r] = std::max(largest_group[r], b);
    });
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_GE(peak[r], largest_param[r]) << recompute << " rank " << r;
      EXPECT_LE(peak[r], largest_group[r]) << recompute << " rank " << r;
      EXPECT_LT(3 * peak[r], all[r]) << recompute << " rank " << r;
      std::cout << recompute << " rank " << r << ": peak gathered " << peak[r] << " B, largest layer " << largest_group[r]
                << " B, every parameter " << all[r] << " B\n";
    }
  }
}

// 20 steps of stage 3 (recompute none, full, selective) follow plain dp on every mesh.
TEST(ShardingStage3, FollowsPlainDataParallelOnEveryMeshWithEveryRecompute) {
  int exact = 0, runs = 0;
  for (const std::string mesh : {"dp=2", "dp=4", "dp=2,tp=2", "pp=2,dp=2"}) {
    TrainConfig c = small_config(mesh, 20);
    c.optimizer.accumulation = 2, c.optimizer.micro_batch = 0;
    const std::vector<double> plain = train(c, 20).losses;
    for (const std::string recompute : {"none", "full", "selective"}) {
      expect_same_curve(train(stage3(c, recompute), 20).losses, plain, mesh + " stage 3 recompute " + recompute, &exact);
      ++runs;
    }
  }
  std::cout << exact << " of " << runs << " stage-3 curves are bit-identical to plain dp\n";
}

// --prefetch-params 1 (graph/prefetch.h): the same collectives as without prefetch, only started a
// layer earlier, so the same bits; on dp=2, dp=4, dp=2 x tp=2 and pp=2 x dp=2, with accumulation
// (pp: micro-batches in flight) and full recompute (the backward's gathers per segment). Every step
// started gathers ahead (StepStats::prefetched_gathers), none without the option.
TEST(ShardingStage3, PrefetchGivesTheBitsOfNoPrefetchOnEveryMesh) {
  auto run = [](const TrainConfig& c, int64_t steps) {
    std::vector<double> losses;
    std::vector<int64_t> prefetched;
    const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
    comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      for (int64_t s = 0; s < steps; ++s) {
        const double l = t.step().loss;
        if (w.rank() == 0) losses.push_back(l), prefetched.push_back(t.stages().last_stats().prefetched_gathers);
      }
    });
    return std::pair{losses, prefetched};
  };
  int exact = 0;
  for (const std::string mesh : {"dp=2", "dp=4", "dp=2,tp=2", "pp=2,dp=2"}) {
    TrainConfig c = small_config(mesh, 10);
    c.optimizer.accumulation = 2, c.optimizer.micro_batch = 0;
    const std::vector<double> plain = train(c, 10).losses;
    for (const std::string recompute : {"none", "full"}) {
      TrainConfig off = stage3(c, recompute), on = off;
      on.parallel.sharding.prefetch_params = 1;
      const auto [want, none] = run(off, 10);
      const auto [got, started] = run(on, 10);
      const std::string what = mesh + " recompute " + recompute;
      EXPECT_EQ(got, want) << what << ": prefetch changed the bits";
      expect_same_curve(got, plain, what + " prefetch vs plain dp", &exact);
      for (size_t s = 0; s < started.size(); ++s) {
        EXPECT_GT(started[s], 0) << what << " step " << s + 1;
        EXPECT_EQ(none[s], 0) << what << " step " << s + 1;
      }
    }
  }
}

// MoE on dp=2 x ep=2: dense parameters stored over dp x ep (two mesh dims on dim 0), experts over dp
// after ep; prefetching one layer starts gathers early and gives the same bits.
TEST(ShardingStage3, MoeOnDpTimesEpPrefetchGivesTheBitsOfNoPrefetch) {
  TrainConfig c = stage3(llama_test_config("dp=2,ep=2", 4));
  c.model.experts = 4, c.model.top_k = 2;
  std::vector<double> losses[2];
  std::vector<int64_t> started[2];
  for (int prefetch : {0, 1}) {
    c.parallel.sharding.prefetch_params = prefetch;
    comm::LocalWorld::run(4, [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      for (int s = 0; s < 4; ++s) {
        const double l = t.step().loss;
        if (w.rank() == 0) losses[prefetch].push_back(l), started[prefetch].push_back(t.stages().last_stats().prefetched_gathers);
      }
    });
  }
  EXPECT_EQ(losses[1], losses[0]);
  for (size_t s = 0; s < started[1].size(); ++s) {
    EXPECT_GT(started[1][s], 0) << "step " << s + 1;
    EXPECT_EQ(started[0][s], 0) << "step " << s + 1;
  }
}

// With N layers prefetched the gathered copies alive at once are at most N + 1 layers' (the one
// computing and the next N), more than with N - 1; the layer of a parameter is its name's prefix
// through the layer number.
TEST(ShardingStage3, PrefetchHoldsAtMostTwoLayersGatheredParameters) {
  EXPECT_EQ(graph::param_layer("transformer.h.3.attn.c_attn.weight"), "transformer.h.3");
  EXPECT_EQ(graph::param_layer("model.layers.12.mlp.experts.0.w1"), "model.layers.12");
  EXPECT_EQ(graph::param_layer("transformer.wte.weight"), "transformer.wte.weight");
  for (const std::string recompute : {"none", "full"}) {
    TrainConfig c = stage3(small_config("dp=2", 2), recompute);
    c.model.layers = 4;
    std::vector<std::vector<int64_t>> peak(3, std::vector<int64_t>(2)), largest(3, std::vector<int64_t>(2));
    for (int prefetch : {0, 1, 2}) {
      c.parallel.sharding.prefetch_params = prefetch;
      comm::LocalWorld::run(2, [&](comm::Communicator& w) {
        Trainer t(c, w.group(w.members()));
        t.step();
        const size_t r = static_cast<size_t>(w.rank()), n = static_cast<size_t>(prefetch);
        peak[n][r] = t.stages().last_stats().peak_gathered_bytes;
        std::map<std::string, int64_t> by_layer;
        for (const ParamState& p : t.params())
          by_layer[graph::param_layer(p.name)] += gathered_bytes(p, t.strategy().dp, my_coords(p, w.rank()));
        std::vector<int64_t> sizes;
        for (const auto& [layer, b] : by_layer) sizes.push_back(b);
        std::sort(sizes.rbegin(), sizes.rend());
        for (size_t k = 0; k <= n && k < sizes.size(); ++k) largest[n][r] += sizes[k];  // the n + 1 largest layers
      });
    }
    for (size_t r = 0; r < 2; ++r) {
      for (size_t n = 1; n <= 2; ++n) {
        EXPECT_GT(peak[n][r], peak[n - 1][r]) << recompute << " prefetch " << n << " rank " << r;
        EXPECT_LE(peak[n][r], largest[n][r]) << recompute << " prefetch " << n << " rank " << r;
      }
      std::cout << recompute << " rank " << r << ": peak gathered " << peak[0][r] << " B without prefetch, " << peak[1][r]
                << " B with 1 layer (two largest layers " << largest[1][r] << " B), " << peak[2][r]
                << " B with 2 (three largest " << largest[2][r] << " B)\n";
    }
  }
}

TEST(ShardingStage3, PrefetchOptionIsCheckedNamingIt) {
  TrainConfig c = small_config("dp=2", 1);
  auto refused = [&](const std::string& want) {
    try {
      c.check(2);
      ADD_FAILURE() << "accepted; wanted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  c.parallel.sharding = {3, "v1"};
  c.parallel.sharding.prefetch_params = -1;
  refused("--prefetch-params must be 0 (off) or a number of layers, got -1");
  c.parallel.sharding = {2, "v1"};
  c.parallel.sharding.prefetch_params = 1;
  refused("--prefetch-params 1 prefetches stage 3's parameter all-gathers: it needs --sharding-stage 3 (got stage 2)");
  c.parallel.sharding.stage = 3;
  EXPECT_NO_THROW(c.check(2));
}

TEST(ShardingStage3, LlamaFollowsPlainDataParallel) {
  int exact = 0;
  for (const std::string mesh : {"dp=2,tp=2", "pp=2,dp=2"}) {
    TrainConfig c = llama_test_config(mesh, 10);
    const std::vector<double> plain = train(c, 10).losses;
    expect_same_curve(train(stage3(c), 10).losses, plain, mesh + " llama stage 3", &exact);
    expect_same_curve(train(stage3(c, "full"), 10).losses, plain, mesh + " llama stage 3 recompute full", &exact);
  }
}

// Stage 3's checkpoints hold the unsharded keys and move to and from every layout and mesh
// (expect_checkpoint_moves: bit-exact states, the resumed curve).
TEST(ShardingStage3, CheckpointsMoveBetweenStageThreeAndEveryOtherLayoutAndMesh) {
  for (const LayoutMove& k : std::vector<LayoutMove>{
           {"dp=4", 3, "v1", "dp=2,tp=2", 3, "v1"},       // stage 3, dp=4 -> dp=2 x tp=2
           {"dp=4", 0, "v1", "dp=4", 3, "v1"},            // none -> stage 3
           {"dp=2,tp=2", 3, "v1", "dp=1", 0, "v1"},       // stage 3 -> none
           {"dp=4", 1, "v1", "pp=2,dp=2", 3, "v1"},       // v1 -> stage 3, with pp
           {"pp=2,dp=2", 3, "v1", "dp=4", 1, "v2"},       // stage 3 with pp -> v2
           {"dp=2,tp=2", 1, "v2", "dp=4", 3, "v1"},       // v2 -> stage 3
           {"dp=4", 3, "v1", "dp=2,tp=2", 2, "v2"},       // stage 3 -> stage 2
           {"pp=2,dp=2", 2, "v1", "dp=2,tp=2", 3, "v1"},  // stage 2 with pp -> stage 3
       })
    expect_checkpoint_moves(k);
}

// bf16 parameters: the fp32 masters are the shards too, and move to and from stage 2 v2 bit for bit.
TEST(ShardingStage3, Bf16MastersMoveBetweenStageThreeAndStageTwo) {
  TrainConfig from = sharded(small_config("dp=2,tp=2", 4), 3, "v1", true);
  TrainConfig to = sharded(small_config("dp=4", 4), 2, "v2", true);
  fs::path root = fresh_dir("stage3-bf16");
  TrainRun saved = train(from, 3, {}, root, true);
  fs::path dir = ckpt::find_resume(root)->dir;
  EXPECT_TRUE(fs::exists(dir / "master_weights.safetensors.index.json"));
  expect_same_states(train(to, 0, dir, {}, true).states, saved.states, "bf16 stage 3 -> stage 2 v2");
  TrainConfig back = from;
  back.parallel.mesh = "dp=4";
  expect_same_states(train(back, 0, dir, {}, true).states, saved.states, "bf16 stage 3 -> stage 3 dp=4");
  fs::remove_all(root);
}

}  // namespace
}  // namespace shardwise::train
