// The synchronized, prefetching loader (data/loader.h): each tp group's reader reads its
// data-parallel block and broadcasts it, the next step read on a background thread. The losses are
// bit for bit those of every rank reading the whole micro-batch itself (the earlier path, kept as
// LoaderOptions::synchronized false) on dp, tp, dp x tp, pp x tp (interleaved too), tp + sp and with
// packed documents; ranks other than the readers never read nor open the data file, in training,
// validation and checkpointing (the test hook SHARDWISE_TEST_UNREADABLE_FOR_RANKS makes either an
// Error there).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/support/pipeline_config.h"
#include "shardwise/core/error.h"
#include "tests/support/small_config.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

std::vector<double> losses(TrainConfig c, bool synchronized, bool prefetch, int64_t steps = 3) {
  c.data.loader_sync = synchronized;
  c.data.loader_prefetch = prefetch;
  return train_losses(c, steps, {}, {});
}

// Windows of short documents ended by token 1 (u16), for packing; per process (ctest runs this
// file's tests in parallel processes, each rewriting it).
fs::path documents_file() {
  fs::path p = fs::temp_directory_path() / ("shardwise_loader_docs_" + std::to_string(::getpid()) + ".bin");
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  uint32_t state = 7;
  auto next = [&] { return state = state * 1103515245u + 12345u, state >> 16; };
  for (int doc = 0; doc < 300; ++doc) {
    const uint32_t length = 2 + next() % 10;
    for (uint32_t i = 0; i <= length; ++i) {
      const uint32_t t = i == length ? 1 : 2 + next() % 62;
      out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
    }
  }
  return p;
}

TrainConfig packed(const std::string& mesh) {
  TrainConfig c = pipeline_test_config(mesh);
  c.model.seq = 16, c.model.vocab = 64, c.model.layers = 2;
  c.optimizer.accumulation = 2;
  c.data.files = documents_file().string();
  c.data.eos_id = 1;
  c.data.document_attention = true;
  return c;
}

std::vector<std::pair<std::string, TrainConfig>> meshes() {
  std::vector<std::pair<std::string, TrainConfig>> out;
  for (const char* m : {"dp=2", "tp=2", "dp=2,tp=2"}) out.emplace_back(m, small_config(m, 3));
  out.emplace_back("pp=2,tp=2", pipeline_test_config("pp=2,tp=2"));
  out.emplace_back("pp=2,tp=2 interleaved", pipeline_test_config("pp=2,tp=2", "interleaved"));
  TrainConfig sp = small_config("tp=2", 3);
  sp.parallel.sequence_parallel = true;
  out.emplace_back("tp=2 + sp", sp);
  out.emplace_back("dp=2,tp=2 packed", packed("dp=2,tp=2"));
  out.emplace_back("pp=2,tp=2 packed", packed("pp=2,tp=2"));
  for (const char* m : {"cp=2", "dp=2,cp=2", "tp=2,cp=2"}) {  // context parallelism: tp x cp groups
    TrainConfig cp = small_config(m, 3);
    cp.model.seq = 16;
    out.emplace_back(m, cp);
  }
  out.emplace_back("cp=2 packed", packed("cp=2"));
  return out;
}

TEST(Loader, SynchronizedBatchesTrainBitForBitAsEveryRankReadingTheWholeBatch) {
  for (const auto& [name, c] : meshes()) {
    const std::vector<double> every_rank = losses(c, false, false);
    ASSERT_EQ(every_rank.size(), 3u) << name;
    EXPECT_EQ(losses(c, true, true), every_rank) << name;
    EXPECT_EQ(losses(c, true, false), every_rank) << name << " without prefetch";
  }
}

// Sets the test hook for the test's scope.
struct UnreadableFor {
  explicit UnreadableFor(const char* ranks) { setenv("SHARDWISE_TEST_UNREADABLE_FOR_RANKS", ranks, 1); }
  ~UnreadableFor() { unsetenv("SHARDWISE_TEST_UNREADABLE_FOR_RANKS"); }
};

TEST(Loader, RanksOtherThanTheReadersNeverRead) {
  // Ranks 1 and 3 have tp coordinate 1 on dp=2 x tp=2 and pp=2 x tp=2 (rank = outer x 2 + tp).
  for (const auto& [name, c] : meshes()) {
    if (name.find("tp=2") == std::string::npos) continue;
    const std::vector<double> every_rank = losses(c, false, false);
    UnreadableFor hook(c.parallel.mesh == "tp=2" ? "1" : c.parallel.mesh == "tp=2,cp=2" ? "1,2,3" : "1,3");
    EXPECT_EQ(losses(c, true, true), every_rank) << name;
  }
  // cp: the ranks with cp coordinate 1 (cp=2: rank 1; dp=2 x cp=2: ranks 1 and 3) read nothing.
  for (const auto& [name, c] : meshes()) {
    if (name.find("cp=2") == std::string::npos || name.find("tp=2") != std::string::npos) continue;
    const std::vector<double> every_rank = losses(c, false, false);
    UnreadableFor hook(c.parallel.mesh == "cp=2" ? "1" : "1,3");
    EXPECT_EQ(losses(c, true, true), every_rank) << name;
  }
}

TEST(Loader, TheHookBitesWhereARankReads) {
  UnreadableFor hook("1");
  TrainConfig c = small_config("dp=2,tp=2", 3);
  // Every rank reading: rank 1 reads, and fails naming the hook.
  try {
    losses(c, false, false, 1);
    FAIL() << "rank 1 read without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SHARDWISE_TEST_UNREADABLE_FOR_RANKS=1"), std::string::npos) << e.what();
  }
  // A reader listed: the step fails, the group's peers waiting in the broadcast are released.
  UnreadableFor reader("2");
  EXPECT_THROW(losses(c, true, true, 1), Error);
}

// On a token file with a validation set, saving a checkpoint at the end: rank 0's training and
// validation losses (a validation after every step).
std::vector<double> file_losses(const TrainConfig& c, const fs::path& save_to) {
  std::vector<double> out;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    for (int s = 0; s < 3; ++s) {
      const double loss = t.step().loss, val = t.validate().loss;
      if (w.rank() == 0) out.push_back(loss), out.push_back(val);
    }
    save_trainer(t, *world, save_to);
  });
  return out;
}

// The non-readers listed (tp coordinate 1; with pp=4 the middle stages, which bind nothing) may
// not even open the data file: configuration checks, the fingerprint, training and validation
// batches all come from the readers, and the losses are bit for bit those without the hook.
TEST(Loader, NonReadersNeverOpenTheDataFile) {
  const fs::path save = fs::temp_directory_path() / ("shardwise_loader_ckpt_" + std::to_string(::getpid()));
  TrainConfig dp_tp = packed("dp=2,tp=2");
  dp_tp.data.document_attention = false;
  TrainConfig pp4 = packed("pp=4");
  pp4.data.document_attention = false, pp4.model.layers = 4;
  const std::vector<std::tuple<std::string, TrainConfig, const char*>> cases = {
      {"dp=2,tp=2", dp_tp, "1,3"}, {"pp=2,tp=2 packed", packed("pp=2,tp=2"), "1,3"}, {"pp=4", pp4, "1,2"}};
  for (auto [name, c, hook] : cases) {
    c.data.val_fraction = 0.2, c.data.val_samples = 5;  // the last validation micro-batch padded
    fs::remove_all(save);
    const std::vector<double> plain = file_losses(c, save);
    ASSERT_EQ(plain.size(), 6u) << name;
    fs::remove_all(save);
    UnreadableFor unreadable(hook);
    EXPECT_EQ(file_losses(c, save), plain) << name << " with ranks " << hook << " unable to open the data";
  }
  fs::remove_all(save);
  // A reader listed (rank 2: the second dp replica's reader) fails as it opens the file, before any
  // step, naming the hook; so would any non-reader that opened it.
  UnreadableFor reader("2");
  try {
    train_losses(dp_tp, 1, {}, {});
    FAIL() << "rank 2 opened the data without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 opened the data"), std::string::npos) << e.what();
  }
}

// The loader's blocked time comes with every step. A restored position other than the prefetched
// one (a resume) drops the prefetch and reads the samples asked for: the steps match those of
// every rank reading without prefetch, jumping alike.
std::vector<double> jumping(TrainConfig c, bool synchronized, bool prefetch) {
  c.data.loader_sync = synchronized;
  c.data.loader_prefetch = prefetch;
  std::vector<double> out;
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int s = 0; s < 4; ++s) {
      if (s == 1) t.restore_position(5, 5 * c.optimizer.global_batch);  // not the prefetched samples
      if (s == 3) t.restore_position(7, 7 * c.optimizer.global_batch);  // the prefetched ones
      StepResult r = t.step();
      EXPECT_GE(r.loader_wait_s, 0.0);
      if (w.rank() == 0) out.push_back(r.loss);
    }
  });
  return out;
}

TEST(Loader, ReportsBlockedTimeAndFollowsARestoredPosition) {
  TrainConfig c = small_config("dp=2,tp=2", 10);
  EXPECT_EQ(jumping(c, true, true), jumping(c, false, false));
}

}  // namespace
}  // namespace shardwise::train
