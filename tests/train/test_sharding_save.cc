// Checkpoints straight from the sharded optimizer's ranges (stages 1-2): each dp rank writes its
// ranges of the moments and masters into the stored tensors and reads back only its ranges. The
// files are byte for byte those of an unsharded run in the same state, no whole block of the
// moments is allocated while saving, and the states move between layouts and meshes bit for bit.
#include "shardwise/ckpt/checksum.h"
#include "shardwise/tensor/allocator.h"
#include "tests/support/sharding_runs.h"

namespace shardwise::train {
namespace {

using namespace sharding_test;

// The xxh64 of every safetensors and index file of the newest checkpoint under `root`.
std::map<std::string, std::string> tensor_file_digests(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(ckpt::find_resume(root)->dir)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors") || name.ends_with(".index.json"))
      out[name] = ckpt::digest_file(e.path(), false).xxh64;
  }
  return out;
}

// Stage 1 reads the graph's all-reduced gradients and updates each element as plain dp does, so
// after 3 steps a sharded trainer holds the bits of a plain one (checked on the states here): its
// checkpoint, written from the ranges, must be the plain run's files byte for byte.
TEST(ShardingSave, RangesWriteTheFilesOfAnUnshardedRunInTheSameState) {
  for (const auto& [mesh, layout, bf16] : {std::tuple{"dp=4", "v2", false}, std::tuple{"dp=2,tp=2", "v2", true},
                                           std::tuple{"pp=2,dp=2", "v2", false}, std::tuple{"dp=4", "v1", true}}) {
    const std::string what = fmt::format("{} stage 1 {}{}", mesh, layout, bf16 ? " bf16" : "");
    TrainConfig plain = sharded(small_config(mesh, 3), 0, "v1", bf16);
    plain.optimizer.accumulation = 2, plain.optimizer.micro_batch = 0;
    TrainConfig c = plain;
    c.parallel.sharding = {1, layout};
    fs::path a = fresh_dir("plain"), b = fresh_dir("ranges");
    TrainRun want = train(plain, 3, {}, a, true), got = train(c, 3, {}, b, true);
    expect_same_states(got.states, want.states, what);  // the premise: the same state
    const auto digests = tensor_file_digests(a);
    EXPECT_EQ(digests.count(bf16 ? "master_weights.safetensors.index.json" : "optimizer.safetensors.index.json"), 1u);
    EXPECT_EQ(tensor_file_digests(b), digests) << what;
    fs::remove_all(a), fs::remove_all(b);
  }
}

// --async-save copies each rank's ranges into its staging buffers and writes them in the background
// while the next step changes the state in place: the same files as a synchronous save before it.
TEST(ShardingSave, AnAsynchronousSaveOfRangesWritesTheSameFiles) {
  TrainConfig c = sharded(small_config("dp=2,tp=2", 3), 2, "v2", true);
  fs::path sync = fresh_dir("sync"), async = fresh_dir("async");
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    for (int s = 0; s < 3; ++s) t.step();
    save_trainer(t, *world, sync);
    CheckpointSchedule background(async, 0, true, {});
    background.after_step(t, *world, true);
    t.step();  // the background save writes the staged copies, not the state after this step
    background.finish();
  });
  EXPECT_EQ(tensor_file_digests(async), tensor_file_digests(sync));
  fs::remove_all(sync), fs::remove_all(async);
}

// A stage-1 v2 save on dp=4 allocates no whole block of a moment: the storage cache's peak during the
// save stays at what the ranks held before it (blocks from 1 MiB are counted; the embedding's moment
// is 2 MiB). The same measurement around a gather of one whole moment sees it. A load allocates the
// ranks' weights and no whole moment.
TEST(ShardingSave, AStageOneV2SaveAndLoadAllocateNoWholeBlockOfTheMoments) {
  TrainConfig c = sharded(small_config("dp=4", 1), 1, "v2");
  c.model.vocab = 8192, c.model.hidden = 64;  // transformer.wte.weight: 8192 x 64 f32 = 2 MiB per moment
  const int64_t moment_bytes = 8192 * 64 * 4;
  fs::path root = fresh_dir("peak");
  int64_t save_extra = -1, gather_extra = -1, load_extra = -1;
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    t.step();
    auto extra_of = [&](const std::function<void()>& f) {
      int64_t base = 0;
      world->barrier();
      if (w.rank() == 0) base = allocator_stats().in_use_bytes, reset_allocator_peak();
      world->barrier();
      f();
      world->barrier();
      return allocator_stats().peak_in_use_bytes - base;
    };
    int64_t saved = extra_of([&] { save_trainer(t, *world, root); });
    int64_t gathered = extra_of([&] { t.gather_state("transformer.wte.weight", &ParamState::exp_avg); });
    int64_t loaded = extra_of([&] { load_trainer(t, *world, ckpt::find_resume(root)->dir); });
    if (w.rank() == 0) save_extra = saved, gather_extra = gathered, load_extra = loaded;
  });
  std::cout << "extra peak bytes: save " << save_extra << ", gathering one whole moment " << gather_extra << ", load "
            << load_extra << "\n";
  EXPECT_GE(gather_extra, moment_bytes);  // the measurement sees a whole block
  EXPECT_LT(save_extra, moment_bytes);
  EXPECT_EQ(save_extra, 0);
  // A load reads each rank's whole weight blocks (the kernels' f32 parameters: the embedding is the
  // one block from 1 MiB) and its ranges of the moments (under 1 MiB here): no whole moment.
  EXPECT_LE(load_extra, 4 * moment_bytes);  // 4 ranks x the embedding weight (the size of one moment)
  fs::remove_all(root);
}

// What test_sharding.cc and test_sharding_stage3.cc do not move yet: v2 to v2 on another mesh
// (dp=4 -> dp=2 x tp=2, the ranges cut elsewhere), v1 -> stage 2 v2, stage 2 v2 -> v2, none -> stage 2.
TEST(ShardingSave, RangesMoveBetweenV2MeshesAndStagesBitForBit) {
  for (const LayoutMove& k : std::vector<LayoutMove>{
           {"dp=4", 1, "v2", "dp=2,tp=2", 1, "v2"},
           {"dp=4", 1, "v1", "pp=2,dp=2", 2, "v2"},
           {"dp=2,tp=2", 2, "v2", "dp=4", 1, "v2"},
           {"dp=2,tp=2", 0, "v1", "dp=4", 2, "v2"},
       })
    expect_checkpoint_moves(k);
}

// After a load every rank's bf16 parameter is its whole block of the masters rounded: each rank
// checks the elements of its own range of the master (all ranges cover the block), or, unsharded,
// the whole block.
int64_t params_that_are_not_rounded_masters(Trainer& t) {
  int64_t bad = 0;
  for (size_t i = 0; i < t.params().size(); ++i) {
    const ParamState& p = t.params()[i];
    const int64_t begin = t.sharded() ? t.sharded()->plan().begin(i) : 0;
    const Tensor rounded = p.master.to(DType::BF16);
    for (int64_t j = 0; j < rounded.numel(); ++j) {
      if (p.param.at(begin + j) != rounded.at(j)) {
        ++bad;
        break;
      }
    }
  }
  return bad;
}

// bf16: the masters are ranges too; v2 dp=4 -> v2 dp=2 x tp=2, -> stage 2 v1, -> stage 3 and -> none,
// bit for bit, and the kernels' bf16 copies are the loaded masters rounded.
TEST(ShardingSave, Bf16MasterRangesMoveToOtherRangesStageThreeAndNone) {
  TrainConfig from = sharded(small_config("dp=4", 4), 1, "v2", true);
  fs::path root = fresh_dir("bf16-ranges");
  TrainRun saved = train(from, 3, {}, root, true);
  fs::path dir = ckpt::find_resume(root)->dir;
  for (const auto& [mesh, stage, layout] : {std::tuple{"dp=2,tp=2", 1, "v2"}, std::tuple{"dp=2,tp=2", 2, "v1"},
                                            std::tuple{"dp=4", 3, "v1"}, std::tuple{"dp=1", 0, "v1"}}) {
    const std::string what = fmt::format("bf16 dp=4 v2 -> {} stage {} {}", mesh, stage, layout);
    TrainConfig to = sharded(small_config(mesh, 4), stage, layout, true);
    expect_same_states(train(to, 0, dir, {}, true).states, saved.states, what);
    comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(mesh).size()), [&](comm::Communicator& w) {
      auto world = w.group(w.members());
      Trainer t(to, world);
      load_trainer(t, *world, dir);
      EXPECT_EQ(params_that_are_not_rounded_masters(t), 0) << what << " rank " << w.rank();
    });
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace shardwise::train
