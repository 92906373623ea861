// Crash safety: a child process saving checkpoint-2 (two ranks, several shards) raises SIGKILL on
// itself at 20 different crash points of the save, sync and async. After each, resume must find
// a complete checkpoint (checkpoint-1, or checkpoint-2 once it was renamed into place) whose
// manifest and contents verify, every directory without ".tmp" must verify, and stale ".tmp"
// directories must be gone.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/async_saver.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/comm/local.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

std::vector<GlobalTensor> model_at(int step) {
  auto model = small_model();
  int seed = 100 * step;
  for (auto& t : model) t.value = make_global(t.value.dtype(), t.value.shape(), seed++);
  return model;
}

SaveOptions crash_options() {
  SaveOptions o;
  o.max_shard_bytes = 300;
  o.split_bytes = 0;
  return o;
}

void save_step(const fs::path& root, int step, bool async) {
  auto model = model_at(step);
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    CheckpointContent content = content_for(model, topologies()[1], c.rank(), step);
    if (async) {
      AsyncSaver saver(crash_options());
      saver.save(c, root, content);
      saver.finish();
    } else {
      save_checkpoint(c, root, content, crash_options());
    }
  });
}

void expect_contents(const fs::path& dir, int step) {
  for (const auto& t : model_at(step)) {
    GroupReader g(dir, t.group);
    EXPECT_TRUE(bit_equal(g.file_of(t.name).read(t.name), t.value)) << dir << " " << t.name;
  }
}

TEST(CheckpointCrash, KilledAtTwentyPointsResumeFindsACompleteCheckpoint) {
  // How many crash points a whole save passes.
  int64_t points = 0;
  {
    ScratchDir probe("probe");
    arm_crash_point(0);
    save_step(probe.path, 2, false);
    points = crash_points_passed();
  }
  ASSERT_GE(points, 20);
  ScratchDir scratch("crash");
  save_step(scratch.path, 1, false);
  int resumed_new = 0;
  for (int i = 0; i < 20; ++i) {
    int64_t k = 1 + i * (points - 1) / 19;  // 1 .. points, evenly spread
    bool async = i % 2 == 1;
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      arm_crash_point(k, CrashAction::Kill);
      try {
        save_step(scratch.path, 2, async);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "crash point " << k << " status " << status;

    // Every directory that looks complete is complete.
    for (const auto& c : list_checkpoints(scratch.path)) {
      VerifyReport r = verify_checkpoint(c.dir);
      EXPECT_TRUE(r.ok()) << "point " << k << ": " << c.dir << " " << (r.ok() ? "" : r.problems.front());
    }
    auto found = find_resume(scratch.path);
    ASSERT_TRUE(found.has_value()) << "point " << k;
    ASSERT_TRUE(found->step == 1 || found->step == 2);
    expect_contents(found->dir, static_cast<int>(found->step));
    for (const auto& e : fs::directory_iterator(scratch.path)) {
      EXPECT_FALSE(e.path().filename().string().ends_with(".tmp")) << "stale " << e.path() << " after point " << k;
    }
    if (found->step == 2) {
      ++resumed_new;
      fs::remove_all(found->dir);  // back to the state before the save for the next point
    }
  }
  // The last points come after the rename: the new checkpoint is whole there.
  EXPECT_GE(resumed_new, 1);
  EXPECT_LT(resumed_new, 20);
}

}  // namespace
}  // namespace shardwise::ckpt
