// The memory and time of one checkpoint save of a sharded Trainer (issue 15 point 4;
// bench/sharding_save.sh), ranks as threads of one process.
//
//   bench_sharding_save --dir DIR [--mesh dp=4 --stage 1 --layout v2 --steps 0 --layers 14 --hidden 768
//                       --heads 12 --seq 128 --vocab 8192]
//
// Prints the storage cache's bytes in use before the save (tensor/allocator.h: the whole process,
// every rank), its peak during the save less that (the save's extra peak bytes), and the save's
// wall time (every rank's save_trainer, from a barrier to a barrier). Saves into DIR, removed after.
// Only the Trainer and save_trainer are used, so the same file builds against earlier commits.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "shardwise/comm/local.h"
#include "shardwise/tensor/allocator.h"
#include "shardwise/train/checkpointing.h"

using namespace shardwise;

int main(int argc, char** argv) {
  train::TrainConfig c;
  c.model.layers = 14, c.model.hidden = 768, c.model.heads = 12, c.model.seq = 128, c.model.vocab = 8192;
  c.optimizer.micro_batch = 1, c.optimizer.accumulation = 1, c.optimizer.steps = 2, c.optimizer.warmup = 1;
  c.parallel.mesh = "dp=4";
  c.parallel.sharding = {1, "v2"};
  int64_t steps = 0;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--mesh") c.parallel.mesh = v;
    else if (k == "--stage") c.parallel.sharding.stage = std::stoi(v);
    else if (k == "--layout") c.parallel.sharding.layout = v;
    else if (k == "--steps") steps = std::stoll(v);
    else if (k == "--layers") c.model.layers = std::stoi(v);
    else if (k == "--hidden") c.model.hidden = std::stoi(v);
    else if (k == "--heads") c.model.heads = std::stoi(v);
    else if (k == "--seq") c.model.seq = std::stoi(v);
    else if (k == "--vocab") c.model.vocab = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_sharding_save: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "bench_sharding_save: --dir DIR is required\n");
    return 2;
  }
  std::filesystem::remove_all(dir);
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  c.optimizer.global_batch = 0;
  c.check(ranks, false);
  int64_t before = 0, peak = 0, state = 0;
  double seconds = 0;
  comm::LocalWorld::run(ranks, [&](comm::Communicator& world) {
    auto w = world.group(world.members());
    train::Trainer t(c, w);
    for (int64_t s = 0; s < steps; ++s) t.step();
    int64_t mine = t.optimizer_state_bytes();
    w->all_reduce(&mine, &mine, 1, DType::I64, comm::Reduce::Sum);
    w->barrier();
    if (world.rank() == 0) before = allocator_stats().in_use_bytes, reset_allocator_peak(), state = mine;
    w->barrier();
    const auto start = std::chrono::steady_clock::now();
    train::save_trainer(t, *w, dir);
    w->barrier();
    if (world.rank() == 0) {
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      peak = allocator_stats().peak_in_use_bytes;
    }
  });
  std::filesystem::remove_all(dir);
  const double mib = 1024.0 * 1024.0;
  std::printf("%s stage %d %s: optimizer state %.1f MiB (all ranks); in use before the save %.1f MiB; "
              "save extra peak %.1f MiB; save %.2f s\n",
              c.parallel.mesh.c_str(), c.parallel.sharding.stage, c.parallel.sharding.layout.c_str(), static_cast<double>(state) / mib,
              static_cast<double>(before) / mib, static_cast<double>(peak - before) / mib, seconds);
  return 0;
}
