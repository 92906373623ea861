// The file rendezvous (comm/file_rendezvous.h), ranks as threads: a rank that never arrives is an
// Error naming it and the directory; files of a crashed earlier run in the same directory are
// never read; each rank's old files are removed as the calls go on; a rank whose process exited is
// an error at once.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "shardwise/comm/file_rendezvous.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::vector<std::string> on_threads(int n, const std::function<void(int)>& fn, std::chrono::milliseconds stagger = 0ms) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = n - 1; r >= 0; --r) {  // the last rank first, rank 0 last
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
    std::this_thread::sleep_for(stagger);
  }
  for (auto& t : threads) t.join();
  return errors;
}

struct Dir {
  fs::path path;
  explicit Dir(const std::string& tag) : path(fs::temp_directory_path() / fmt::format("sw_frdv_{}_{}", tag, ::getpid())) {
    fs::remove_all(path);
  }
  ~Dir() { fs::remove_all(path); }
};

size_t entries(const fs::path& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

TEST(FileRendezvous, ARankThatNeverCallsIsAnErrorNamingItAndTheDirectory) {
  Dir dir("late");
  auto errors = on_threads(3, [&](int r) {
    FileRendezvous f(dir.path, r, 3, 300ms);
    f.all_gather_bytes("a");
    if (r != 2) f.all_gather_bytes("b");  // rank 2 never makes the second call
  });
  for (int r : {0, 1}) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e.find(fmt::format("file rendezvous '{}' (rank {} of 3): call 1: rank(s) 2 did not arrive within 300 ms",
                                 dir.path.string(), r)), std::string::npos) << e;
  }
  EXPECT_EQ(errors[2], "");
}

TEST(FileRendezvous, ARankThatNeverStartsIsAnErrorNamingIt) {
  Dir dir("absent");
  auto errors = on_threads(4, [&](int r) {
    if (r != 1 && r != 3) FileRendezvous(dir.path, r, 4, 300ms);
  });
  EXPECT_NE(errors[0].find(fmt::format("file rendezvous '{}': rank(s) 1, 3 of 4 did not arrive within 300 ms",
                                       dir.path.string())), std::string::npos) << errors[0];
  EXPECT_NE(errors[2].find("rank 2 of 4 found no session naming it within 300 ms"), std::string::npos) << errors[2];
}

TEST(FileRendezvous, AMessageNeverSentIsAnErrorNamingTheSender) {
  Dir dir("nomsg");
  auto errors = on_threads(2, [&](int r) {
    FileRendezvous f(dir.path, r, 2, 200ms);
    if (r == 1) f.recv_bytes(0, 7);
  });
  EXPECT_NE(errors[1].find("rank 0 sent no message 0 (tag 7) within 200 ms"), std::string::npos) << errors[1];
}

TEST(FileRendezvous, FilesOfACrashedEarlierRunAreNeverRead) {
  Dir dir("stale");
  // The earlier run: two calls, then every rank "crashes" (its files stay), and a session file and
  // hello files naming other nonces, as a run killed while starting would leave them.
  auto errors = on_threads(2, [&](int r) {
    FileRendezvous f(dir.path, r, 2, 5s);
    f.all_gather_bytes(fmt::format("old{}", r));
    f.all_gather_bytes(fmt::format("old{}", r));
  });
  ASSERT_EQ(errors, std::vector<std::string>(2));
  std::ofstream(dir.path / "rdv-hello-1") << "0123456789abcdef";
  std::ofstream(dir.path / "unrelated.txt") << "kept";
  // The new run's rank 1 starts well before its rank 0, while the old session file is still there.
  std::vector<std::string> got(2);
  errors = on_threads(2, [&](int r) {
    FileRendezvous f(dir.path, r, 2, 5s);
    for (int k = 0; k < 3; ++k) got[static_cast<size_t>(r)] += f.all_gather_bytes(fmt::format("new{}", r))[0];
  }, 200ms);
  ASSERT_EQ(errors, std::vector<std::string>(2));
  EXPECT_EQ(got[0], "new0new0new0");
  EXPECT_EQ(got[1], "new0new0new0");
  // Only this run's files are left: the session file, its directory, and the file it does not own.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  ASSERT_EQ(left.size(), 3u) << fmt::format("{}", fmt::join(left, " "));
  EXPECT_EQ(left[1], "rdv-session");
  EXPECT_EQ(left[2], "unrelated.txt");
}

TEST(FileRendezvous, OldCallsAndReadMessagesAreRemoved) {
  Dir dir("clean");
  fs::path session;
  auto errors = on_threads(3, [&](int r) {
    FileRendezvous f(dir.path, r, 3, 5s);
    if (r == 0) session = f.session_dir();
    for (int k = 0; k < 5; ++k) {
      auto all = f.all_gather_bytes(std::string(static_cast<size_t>(k + r), 'x'));
      for (int q = 0; q < 3; ++q) EXPECT_EQ(all[static_cast<size_t>(q)].size(), static_cast<size_t>(k + q));
    }
    f.send_bytes("hi", (r + 1) % 3, 4);
    EXPECT_EQ(f.recv_bytes((r + 2) % 3, 4), "hi");
    f.send_bytes("", (r + 1) % 3, 4);
    EXPECT_EQ(f.recv_bytes((r + 2) % 3, 4), "");
  });
  ASSERT_EQ(errors, std::vector<std::string>(3));
  EXPECT_EQ(entries(session), 3u);  // c4-r0, c4-r1, c4-r2
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(fs::exists(session / fmt::format("c4-r{}", r)));
}

// A rank runs in a child process that joins the group, makes `calls` calls and exits: the parent,
// waiting with a 60 s timeout, learns of the exit within a second or two, not at the timeout.
pid_t rank_process(const fs::path& dir, int rank, int size, int calls) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      FileRendezvous f(dir, rank, size, 60s);
      for (int c = 0; c < calls; ++c) f.all_gather_bytes("x");
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  return pid;
}

TEST(FileRendezvous, ARankWhoseProcessExitedIsAnErrorAtOnceNamingIt) {
  Dir dir("exited");
  const pid_t child = rank_process(dir.path, 1, 2, 0);  // joins, then exits before the first call
  ASSERT_GT(child, 0);
  FileRendezvous f(dir.path, 0, 2, 60s);
  try {  // the child is not reaped yet: it exits, and stays a zombie until the waitpid below
    f.all_gather_bytes("a");
    FAIL() << "the call returned without rank 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("call 0: rank 1 (process {} on this machine", child)),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has exited; it will never arrive"), std::string::npos) << e.what();
  }
  // The same for a message: a receiver learns that its sender has exited.
  try {
    f.recv_bytes(1, 7);
    FAIL() << "a message came from an exited rank";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has exited before sending message 0 (tag 7"), std::string::npos) << e.what();
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  try {  // and once reaped, the process is gone
    f.all_gather_bytes("b");
    FAIL() << "the call returned without rank 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("call 1: rank 1 (process"), std::string::npos) << e.what();
  }
}

TEST(FileRendezvous, ARankThatExitsAfterItsCallsLeavesTheOthersTheirResults) {
  Dir dir("finished");
  const pid_t child = rank_process(dir.path, 1, 2, 2);
  ASSERT_GT(child, 0);
  FileRendezvous f(dir.path, 0, 2, 60s);
  EXPECT_EQ(f.all_gather_bytes("a"), (std::vector<std::string>{"a", "x"}));
  EXPECT_EQ(f.all_gather_bytes("b"), (std::vector<std::string>{"b", "x"}));  // written before it exited
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(FileRendezvous, BadArgumentsAreErrors) {
  Dir dir("args");
  EXPECT_THROW(FileRendezvous(dir.path, 2, 2), std::exception);
  EXPECT_THROW(FileRendezvous(dir.path, 0, 1, 0ms), std::exception);
}

}  // namespace
}  // namespace shardwise::comm
