// Per-rank memory of each piece of a training run, planned (train/memory_plan.h) vs measured on the
// Trainer after a few steps, ranks as threads (issue 15, point 6; bench/sharding_memory.sh).
//
//   bench_sharding_memory --mesh dp=4 --stage 3 --recompute full [--layers 14 --hidden 768 --heads 12
//                         --seq 128 --vocab 8192 --micro-batch 1 --steps 2 --bf16 0]
//
// Measured (Trainer::held_bytes): parameters (the ParamStates' `param` bytes), gradients (the
// runner's f32 sums after the step; stage 2 lets them go after the reduce-scatter, so its row shows
// the kept shards), optimizer (Trainer::optimizer_state_bytes: moments and masters), activations
// (StepStats::peak_activation_bytes), gathered parameter copies (StepStats::peak_gathered_bytes,
// stage 3), and the storage cache's peak of bytes in use over the whole process
// (tensor/allocator.h). One line per rank, then the process.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/tensor/allocator.h"
#include "shardwise/train/memory_plan.h"

using namespace shardwise;

namespace {

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }
double ratio(int64_t plan, int64_t got) { return got ? static_cast<double>(plan) / static_cast<double>(got) : 0; }

}  // namespace

int main(int argc, char** argv) {
  train::TrainConfig c;
  c.model.layers = 14, c.model.hidden = 768, c.model.heads = 12, c.model.seq = 128, c.model.vocab = 8192;
  c.optimizer.micro_batch = 1, c.optimizer.accumulation = 1, c.optimizer.steps = 2, c.optimizer.warmup = 1;
  c.parallel.mesh = "dp=1";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mesh") c.parallel.mesh = v;
    else if (k == "--stage") c.parallel.sharding.stage = std::stoi(v);
    else if (k == "--layout") c.parallel.sharding.layout = v;
    else if (k == "--recompute") c.model.recompute = v;
    else if (k == "--layers") c.model.layers = std::stoi(v);
    else if (k == "--hidden") c.model.hidden = std::stoi(v);
    else if (k == "--heads") c.model.heads = std::stoi(v);
    else if (k == "--seq") c.model.seq = std::stoi(v);
    else if (k == "--vocab") c.model.vocab = std::stoi(v);
    else if (k == "--micro-batch") c.optimizer.micro_batch = std::stoll(v);
    else if (k == "--steps") c.optimizer.steps = std::stoll(v);
    else if (k == "--bf16") c.bf16 = v == "1";
    else {
      std::fprintf(stderr, "bench_sharding_memory: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  c.optimizer.global_batch = 0;
  c.check(ranks, false);
  const train::MemoryPlan plan = train::plan_memory(c, true);
  std::vector<train::HeldBytes> got(static_cast<size_t>(ranks));
  comm::LocalWorld::run(ranks, [&](comm::Communicator& world) {
    train::Trainer t(c, world.group(world.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) t.step();
    got[static_cast<size_t>(world.rank())] = t.held_bytes();
  });
  std::printf("%s\n", plan.description.c_str());
  std::printf("rank  piece        plan_MiB  measured_MiB  plan/measured\n");
  for (size_t r = 0; r < got.size(); ++r) {
    const train::RankMemory& p = plan.ranks[r];
    const int64_t grads = c.parallel.sharding.stage == 2 ? p.grad_shards : p.grads;
    const std::pair<const char*, std::pair<int64_t, int64_t>> rows[] = {
        {"params", {p.params, got[r].params}},
        {c.parallel.sharding.stage == 2 ? "grad_shards" : "grads", {grads, got[r].grads}},
        {"optimizer", {p.optimizer + p.masters, got[r].optimizer}},
        {"activations", {p.activations, got[r].activations}},
        {"gathered", {p.gathered, got[r].gathered}}};
    for (const auto& [name, v] : rows)
      std::printf("r%-3zu %-11s %9.1f  %12.1f  %13.4f\n", r, name, mib(v.first), mib(v.second), ratio(v.first, v.second));
    std::printf("r%-3zu %-11s %9.1f\n", r, "plan_peak", mib(p.peak()));
  }
  const AllocatorStats a = allocator_stats();
  std::printf("process: plan %.1f MiB (threads: every rank), storage cache peak in use %.1f MiB\n",
              mib(plan.per_process()), mib(static_cast<int64_t>(a.peak_in_use_bytes)));
  return 0;
}
