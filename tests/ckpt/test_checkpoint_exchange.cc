// Checkpoints saved through the exchange backend (comm/exchange_communicator.h): by 4 ranks as
// threads over the file rendezvous and over an exchange that only all-gathers (the reports then
// travel by collectives), each sync and async, and by 4 processes over the file rendezvous. Each equals,
// file for file and byte for byte (safetensors, index, manifest with its digests), the checkpoint
// the local backend saves, and loads back on another layout bit for bit.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "../support/memory_exchange.h"
#include "exchange_save.h"
#include "shardwise/ckpt/async_saver.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/comm/exchange_communicator.h"
#include "shardwise/comm/file_rendezvous.h"
#include "shardwise/comm/local.h"

extern char** environ;

namespace shardwise::ckpt {
namespace {

using namespace testing;
using namespace std::chrono_literals;

CheckpointContent content_of(int rank) {
  return content_for(small_model(), exchange_topology(), rank, kExchangeStep);
}

void save_local(const fs::path& root) {
  comm::LocalWorld::run(4, [&](comm::Communicator& c) { save_checkpoint(c, root, content_of(c.rank()), exchange_save_options()); });
}

enum class Through { Files, FilesAsync, AllGatherOnly, AllGatherOnlyAsync };

// 4 ranks as threads, each with an ExchangeCommunicator of its own.
void save_exchange(Through through, const fs::path& rendezvous, const fs::path& root) {
  auto hub = std::make_shared<comm::testing::MemoryHub>(4, false);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::shared_ptr<comm::ByteExchange> e;
        const bool messages = through == Through::Files || through == Through::FilesAsync;
        if (!messages) e = std::make_shared<comm::testing::MemoryExchange>(hub, r);
        else e = std::make_shared<comm::FileRendezvous>(rendezvous, r, 4, 60s);
        comm::ExchangeCommunicator c(e);
        if (through == Through::Files || through == Through::AllGatherOnly) {
          save_checkpoint(c, root, content_of(r), exchange_save_options());
          return;
        }
        AsyncSaver saver(exchange_save_options());
        saver.save(c, root, content_of(r));
        // The caller goes on with collectives while the worker sends its reports; without messages the
        // worker makes collectives, and the caller none until finish().
        if (messages) c.barrier();
        EXPECT_EQ(saver.finish(), root / checkpoint_dir_name(kExchangeStep));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

std::map<std::string, std::string> files_under(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    out[fs::relative(e.path(), dir).string()] = s.str();
  }
  return out;
}

void expect_same_files(const fs::path& want, const fs::path& got, const std::string& label) {
  const auto a = files_under(want), b = files_under(got);
  std::vector<std::string> names_a, names_b;
  for (const auto& [n, _] : a) names_a.push_back(n);
  for (const auto& [n, _] : b) names_b.push_back(n);
  ASSERT_EQ(names_a, names_b) << label;
  EXPECT_GT(a.size(), 8u) << label;  // several shards per group, indexes, manifest, JSON files
  for (const auto& [name, bytes] : a) EXPECT_TRUE(b.at(name) == bytes) << label << ": " << name << " differs";
}

// Every block of every tensor on tp=4 (another mesh and layout) equals the original's bit for bit.
void expect_loads_on_tp4(const fs::path& dir, const std::string& label) {
  const Topology to = topologies().back();
  ASSERT_EQ(to.label, "tp4");
  const auto model = small_model();
  for (int64_t process = 0; process < 4; ++process) {
    for (const char* group : {"model", "optimizer", "master_weights"}) {
      std::vector<LoadSpec> specs;
      for (const auto& t : model) {
        if (t.group == group) specs.push_back({t.name, t.value.shape(), t.value.dtype(), layout_of(to, t.name)});
      }
      auto loaded = load_group(dir, group, specs, process);
      for (const auto& t : model) {
        if (t.group != group) continue;
        EXPECT_TRUE(bit_equal(loaded.at(t.name), block_of(t.value, layout_of(to, t.name), process)))
            << label << " process " << process << " " << t.name;
      }
    }
  }
}

TEST(CheckpointExchange, ThreadsThroughFilesOrAllGathersSaveTheLocalBackendsFiles) {
  ScratchDir scratch("exchange");
  save_local(scratch.path / "local");
  const fs::path want = scratch.path / "local" / checkpoint_dir_name(kExchangeStep);
  for (auto [through, label] : {std::pair{Through::Files, "files"}, std::pair{Through::FilesAsync, "files async"},
                                std::pair{Through::AllGatherOnly, "all-gather only"},
                                std::pair{Through::AllGatherOnlyAsync, "all-gather only async"}}) {
    const fs::path root = scratch.path / fmt::format("root{}", static_cast<int>(through));
    save_exchange(through, scratch.path / "rdv", root);
    expect_same_files(want, root / checkpoint_dir_name(kExchangeStep), label);
    expect_loads_on_tp4(root / checkpoint_dir_name(kExchangeStep), label);
  }
}

TEST(CheckpointExchange, FourProcessesThroughFilesSaveTheLocalBackendsFiles) {
  ScratchDir scratch("exchange_procs");
  save_local(scratch.path / "local");
  const fs::path root = scratch.path / "procs", rdv = scratch.path / "rdv";
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    std::vector<std::string> args = {SHARDWISE_CKPT_HELPER, rdv.string(), root.string(), std::to_string(r), "4"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0) << argv[0];
    pids.push_back(pid);
  }
  for (int r = 0; r < 4; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[static_cast<size_t>(r)], &status, 0), pids[static_cast<size_t>(r)]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " ended with status " << status;
  }
  const fs::path got = root / checkpoint_dir_name(kExchangeStep);
  expect_same_files(scratch.path / "local" / checkpoint_dir_name(kExchangeStep), got, "4 processes");
  expect_loads_on_tp4(got, "4 processes");
}

}  // namespace
}  // namespace shardwise::ckpt
