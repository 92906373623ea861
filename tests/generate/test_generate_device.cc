// Generation on a device (Generator's `device`): on the fake device (tensor/fake_device.h: guarded
// memory, its kernel table running the CPU kernels) the transformers-written GPT-2 and Llama tiny
// checkpoints of tests/golden/hf give the CPU run's tokens and logits bit for bit, greedy and
// sampled, on one rank, on dp=2 and tp=2 threads and on the pp meshes pp=2, pp=2 x tp=2 and
// pp=2 x dp=2 (each stage's cache on the device, the residual stream handed over as device
// tensors); the host reads one thing a step, the logits sampling needs (the device-to-host copies
// counted: one per rank of the last stage); a process's graphs all run on one compute stream.
#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "shardwise/comm/local.h"
#include "shardwise/generate/generate.h"
#include "shardwise/models/model_io.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/on_fake_device.h"

namespace shardwise::train {
namespace {

std::string golden(const std::string& name) { return std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf/" + name; }

// Prompts of different lengths (each sequence at its own positions in a decode step).
const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 42, 8, 99}, {3, 64}, {11, 12, 13}, {120}};

struct DeviceRun {
  GenerateResult result;  // rank 0's
  DeviceCopyStats copies;  // every rank's
};

DeviceRun generate_from(const std::string& name, const std::string& mesh, Device device, const GenerateConfig& config) {
  const std::string dir = golden(name);
  const GptConfig model = read_model_config(dir);
  const mesh::ProcessMesh pm = mesh::parse_mesh(mesh);
  DeviceRun out;
  std::mutex mu;
  reset_device_copy_stats();
  comm::LocalWorld::run(static_cast<int>(pm.size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    const int64_t process = world->members()[static_cast<size_t>(world->rank())];
    const Strategy strategy = Strategy::from_mesh(pm, false);
    Generator gen(model, strategy, world, checkpoint_weights(dir, model, process, strategy.pp >= 0), device);
    GenerateResult r = gen.generate(kPrompts, config);
    std::lock_guard lock(mu);
    if (w.rank() == 0) out.result = std::move(r);
  });
  out.copies = device_copy_stats();
  return out;
}

GenerateConfig greedy() {
  GenerateConfig c;
  c.max_new_tokens = 6;
  c.keep_logits = true;
  return c;
}

GenerateConfig sampled() {
  GenerateConfig c = greedy();
  c.sampling.temperature = 0.9;
  c.sampling.top_k = 20;
  c.sampling.seed = 7;
  return c;
}

using GenerateDevice = OnFakeDevice;

void expect_same(const GenerateResult& got, const GenerateResult& want, const std::string& what) {
  ASSERT_EQ(got.sequences.size(), want.sequences.size()) << what;
  for (size_t i = 0; i < want.sequences.size(); ++i) {
    EXPECT_EQ(got.sequences[i].tokens, want.sequences[i].tokens) << what << ", prompt " << i;
    EXPECT_EQ(got.sequences[i].logits, want.sequences[i].logits) << what << ", prompt " << i << " (bit for bit)";
    EXPECT_EQ(got.sequences[i].stop, want.sequences[i].stop) << what << ", prompt " << i;
  }
}

TEST_F(GenerateDevice, TheFakeDeviceGivesTheCpuTokensAndLogitsBitForBit) {
  for (const std::string name : {"gpt2_tiny", "llama_tiny"}) {
    for (const std::string mesh : {"dp=1", "dp=2", "tp=2", "pp=2", "pp=2,tp=2", "pp=2,dp=2"}) {
      for (const auto& [how, config] : {std::pair{"greedy", greedy()}, {"sampled", sampled()}}) {
        const std::string what = fmt::format("{} on {}, {}", name, mesh, how);
        const DeviceRun cpu = generate_from(name, mesh, Device::host(), config);
        const DeviceRun fake = generate_from(name, mesh, kFake, config);
        EXPECT_EQ(cpu.copies.to_device_copies + cpu.copies.to_host_copies, 0) << what;
        EXPECT_GT(fake.copies.to_device_copies, 0) << what;
        expect_same(fake.result, cpu.result, what);
        EXPECT_EQ(fake.result.sequences[0].tokens.size(), 6u) << what;
      }
    }
  }
}

// On a pp mesh each rank of the last stage reads the logits (the others get them by the host
// broadcast): the stages hand the residual stream over on the device, never through the host.
TEST_F(GenerateDevice, TheHostReadsTheLogitsOnceAStepAndNothingElse) {
  const int64_t rows = std::ssize(kPrompts), vocab = read_model_config(golden("llama_tiny")).vocab;
  for (const auto& [mesh, readers] : {std::pair{"dp=1", 1}, {"pp=2", 1}, {"pp=2,tp=2", 2}}) {
    for (const bool cache : {true, false}) {
      GenerateConfig config = greedy();
      config.kv_cache = cache;
      const DeviceRun r = generate_from("llama_tiny", mesh, kFake, config);
      const std::string what = fmt::format("{}, kv cache {}", mesh, cache);
      EXPECT_EQ(r.copies.to_host_copies, r.result.stats.steps * readers) << what;
      EXPECT_EQ(r.copies.to_host_bytes, r.result.stats.steps * readers * rows * vocab * 4) << what;
      EXPECT_GT(r.result.stats.steps, 1) << what;
    }
  }
}

// The prefill's and the decode steps' graphs run on one compute stream per process, so a step's
// cache writes come before the next step's reads whether or not the host waits between them (a
// first stage never reads the logits): the kernels launch on as many streams as there are ranks.
TEST_F(GenerateDevice, EveryGraphOfAProcessRunsOnOneComputeStream) {
  auto& fake = static_cast<FakeDeviceMemory&>(device_memory(kFake));
  for (const auto& [mesh, ranks] : {std::pair{"dp=1", 1u}, {"dp=2", 2u}, {"pp=2", 2u}}) {
    fake.clear_stream_log();
    generate_from("gpt2_tiny", mesh, kFake, greedy());
    std::set<void*> launched_on;
    for (const FakeDeviceMemory::StreamEvent& e : fake.stream_log())
      if (e.kind == FakeDeviceMemory::StreamEvent::Kind::Launch) launched_on.insert(e.stream);
    EXPECT_EQ(launched_on.size(), ranks) << mesh;
  }
}

}  // namespace
}  // namespace shardwise::train
