// `shardwise plan` plans the run `train` describes (its options, --config and defaults), names
// tensors as checkpoints do, counts parameters; `plan --memory` over the limit names the largest
// cause and the change that fixes it, and exits 0 unless --check. The run header lists the options
// that differ from the defaults and the parameter count; `ckpt inspect` counts parameters too.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::gpt2_parameters;
using shardwise_cli_test::lines;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

// "1,234" for 1234.
std::string grouped(int64_t n) {
  std::string d = std::to_string(n), out;
  for (size_t i = 0; i < d.size(); ++i) out += (i > 0 && (d.size() - i) % 3 == 0 ? "," : "") + d.substr(i, 1);
  return out;
}

TEST(CliPlan, PlanTakesTrainsDefaultsConfigAndModel) {
  // No option: train's defaults (examples/demo.toml): dp=2 x tp=2, hidden 128, vocab 128, seq 12
  // (the longest 3-digit addition problem), micro-batch 32 of the global batch 64.
  Result r = run("plan --summary");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("GPT 2 layers, hidden 128, 4 heads, seq 12, vocab 128: " + grouped(gpt2_parameters(2, 128, 12, 128)) +
                       " (414.7 K) parameters; micro-batch 32 per data rank on mesh [dp=2,tp=2]"),
            std::string::npos)
      << r.out;
  // The same from the config file train reads, and a Llama from --model.
  Result cfg = run("plan --summary --config " + std::string(SHARDWISE_SOURCE_DIR) + "/examples/demo.toml");
  ASSERT_EQ(cfg.status, 0) << cfg.out;
  auto described = [](const std::string& out) { return out.substr(out.find("GPT"), out.find("; built") - out.find("GPT")); };
  EXPECT_EQ(described(cfg.out), described(r.out)) << cfg.out;
  EXPECT_NE(cfg.out.find("on mesh [dp=2,tp=2]"), std::string::npos) << cfg.out;
  Result llama = run("plan --summary --model llama --kv-heads 2");
  ASSERT_EQ(llama.status, 0) << llama.out;
  EXPECT_NE(llama.out.find("Llama (2 kv heads"), std::string::npos) << llama.out;
  // A pp mesh has no single program: said, not crashed.
  Result pp = run("plan --mesh pp=2");
  EXPECT_EQ(pp.status, 2) << pp.out;
  EXPECT_NE(pp.out.find("plan --memory"), std::string::npos) << pp.out;
}

TEST(CliPlan, PlanNamesTensorsAsCheckpointsDo) {
  Result r = run("plan --mesh tp=2 --layers 1");
  ASSERT_EQ(r.status, 0) << r.out;
  // GPT-2's fused c_attn: q, k and v are its thirds, named as the checkpoint's key.
  EXPECT_NE(r.out.find("transformer.h.0.attn.c_attn.weight(q)[S(1)]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("transformer.h.0.attn.c_attn(v).mm"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("q_proj"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("names as in the checkpoint: c_attn(q)"), std::string::npos) << r.out;
  // The names a checkpoint of the same model stores.
  const fs::path dir = tmp("sw-plan-names");
  fs::remove_all(dir);
  ASSERT_EQ(run("train --mesh tp=2 --layers 1 --steps 1 --save-every 1 --eval-every 0 --progress none --run-dir " +
                dir.string()).status, 0);
  Result inspect = run("ckpt inspect " + (dir / "checkpoints" / "checkpoint-1").string());
  ASSERT_EQ(inspect.status, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("transformer.h.0.attn.c_attn.weight "), std::string::npos) << inspect.out;
  // Both name forms are explained.
  for (const char* name : {"'transformer.h.0.attn.c_attn(k).out'", "transformer.h.0.attn.k_proj.out"}) {
    Result e = run(std::string("plan --mesh tp=2 --layers 1 --explain ") + name);
    ASSERT_EQ(e.status, 0) << e.out;
    EXPECT_EQ(e.out.rfind("transformer.h.0.attn.c_attn(k).out (activation", 0), 0u) << e.out;
  }
  fs::remove_all(dir);
}

const std::string kBig = "plan --memory --model llama --layers 4 --hidden 512 --heads 8 --seq 1024 --vocab 4096 "
                         "--mesh dp=2 --global-batch 64 ";

TEST(CliPlan, MemoryThatDoesNotFitNamesTheCauseAndTheFixAndExitsZeroUnlessChecked) {
  Result r = run(kBig + "--memory-limit 8GiB");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("does not fit: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the largest part: activations and working buffers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(micro-batch 32 x 1024 tokens)"), std::string::npos) << r.out;
  const size_t fix = r.out.find("  fix: --micro-batch ");
  ASSERT_NE(fix, std::string::npos) << r.out;
  // The fix's estimate is the plan of that run: planned again with the option, it fits.
  const std::string change = r.out.substr(fix + 7, r.out.find(" (", fix) - fix - 7);  // --micro-batch N
  Result fixed = run(kBig + "--memory-limit 8GiB --json " + change);
  ASSERT_EQ(fixed.status, 0) << fixed.out;
  const nlohmann::json j = nlohmann::json::parse(fixed.out);
  EXPECT_TRUE(j["fits"].get<bool>()) << fixed.out;
  EXPECT_LE(j["per_process"].get<int64_t>(), int64_t{8} << 30);
  // --check: the same verdict, then exit 2 with the refusal's one line.
  Result check = run(kBig + "--memory-limit 8GiB --check");
  EXPECT_EQ(check.status, 2) << check.out;
  EXPECT_NE(check.out.find("does not fit: "), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("shardwise: error: the run's estimated peak memory"), std::string::npos) << check.out;
  // JSON: the cause and the fix.
  Result json = run(kBig + "--memory-limit 8GiB --json");
  ASSERT_EQ(json.status, 0) << json.out;
  const nlohmann::json a = nlohmann::json::parse(json.out)["advice"];
  EXPECT_EQ(a["cause"], "activations and working buffers") << json.out;
  EXPECT_EQ(a["fix"].get<std::string>().rfind(change + " (accumulation ", 0), 0u) << json.out;
}

// Every change the advice lists (not only the fix) carries the estimate of that run: planned again
// with the change's options, the plan gives the same bytes. The activation-bound run is offered a
// micro-batch, recompute, the sharding stages and bf16; a state-bound one (dp=4, small batch) the
// stages first.
TEST(CliPlan, EveryChangeTheAdviceListsIsThePlanOfThatChange) {
  const std::string state_bound = "plan --memory --model llama --layers 8 --hidden 512 --heads 8 --seq 32 --vocab 4096 "
                                  "--mesh dp=4 --global-batch 4 ";
  for (const auto& [base, limit] : {std::pair{kBig, std::string("2GiB")}, std::pair{state_bound, std::string("700MiB")}}) {
    Result r = run(base + "--memory-limit " + limit + " --json");
    ASSERT_EQ(r.status, 0) << r.out;
    const nlohmann::json advice = nlohmann::json::parse(r.out)["advice"];
    std::set<std::string> kinds;
    for (const nlohmann::json& c : advice["changes"]) {
      std::string change = c["change"].get<std::string>();
      change = change.substr(0, change.find(" ("));  // "--micro-batch 4 (accumulation 8, ...)" -> the options
      kinds.insert(change.substr(0, change.find(' ')));
      Result again = run(base + "--memory-limit " + limit + " --json " + change);
      ASSERT_EQ(again.status, 0) << change << "\n" << again.out;
      const nlohmann::json j = nlohmann::json::parse(again.out);
      EXPECT_EQ(j["per_process"].get<int64_t>(), c["bytes"].get<int64_t>()) << change;
      EXPECT_EQ(j["fits"].get<bool>(), c["fits"].get<bool>()) << change;
    }
    for (const char* kind : {"--recompute", "--sharding-stage", "--bf16"})
      EXPECT_TRUE(kinds.count(kind)) << kind << " not offered for: " << base << "\n" << r.out;
    if (base == kBig) {
      EXPECT_TRUE(kinds.count("--micro-batch")) << r.out;
    } else {
      EXPECT_EQ(advice["changes"][0]["change"].get<std::string>().rfind("--sharding-stage", 0), 0u) << r.out;
    }
  }
}

TEST(CliPlan, TheRunHeaderListsTheOptionsGivenAndCountsParameters) {
  const fs::path dir = tmp("sw-plan-header");
  fs::remove_all(dir);
  Result r = run("train --mesh dp=1 --model llama --experts 2 --layers 1 --hidden 32 --bf16 --recompute full --steps 1 "
                 "--global-batch 4 --eval-every 0 --progress none --save-every 1 --run-dir " + dir.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string options = r.out.substr(r.out.find("  options: "), r.out.find('\n', r.out.find("  options: ")) -
                                                                          r.out.find("  options: "));
  for (const char* given : {"--bf16", "--recompute full", "--experts 2", "--model llama", "--layers 1", "--mesh dp=1"})
    EXPECT_NE(options.find(given), std::string::npos) << given << "\n" << r.out;
  EXPECT_EQ(options.find("--heads"), std::string::npos) << "a default is not listed: " << options;
  // The parameters: the checkpoint's model tensors, counted by `ckpt inspect` (bf16: the masters hold f32 copies).
  Result inspect = run("ckpt inspect " + (dir / "checkpoints" / "checkpoint-1").string());
  ASSERT_EQ(inspect.status, 0) << inspect.out;
  const size_t group = inspect.out.find("group model: ");
  ASSERT_NE(group, std::string::npos) << inspect.out;
  const size_t from = inspect.out.find(" tensors, ", group) + 10;
  const std::string count = inspect.out.substr(from, inspect.out.find(" parameters", from) - from);
  EXPECT_NE(r.out.find("vocab 128: " + count + " ("), std::string::npos) << count << "\n" << r.out;
  // The tensors of a Llama with 2 experts of 32 x 128: embeddings 128 x 32, per layer q, k, v, o 32 x 32,
  // two norms, the router 2 x 32 and the experts 3 x 2 x 32 x 128, the final norm.
  const int64_t expected = 128 * 32 + 4 * 32 * 32 + 2 * 32 + 2 * 32 + 3 * 2 * 32 * 128 + 32;
  EXPECT_EQ(count, grouped(expected)) << inspect.out;
  fs::remove_all(dir);
}

}  // namespace

// A plan loads no weights: --lora-rank without --init-from plans adapters on a fresh base, both
// the program and its memory, and the other --lora-* options are still checked.
TEST(CliPlan, LoraIsPlannedOnAFreshBaseWithoutInitFrom) {
  Result r = run("plan --mesh dp=2,tp=2 --lora-rank 4 --summary");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("LoRA r 4 on c_attn (base frozen)"), std::string::npos) << r.out;
  r = run("plan --mesh dp=2,tp=2 --lora-rank 4 --memory --json");
  ASSERT_EQ(r.status, 0) << r.out;
  // Only the adapters have AdamW moments (2 x f32): per layer A [4, 128] whole and B [384, 4] cut
  // in two over tp (c_attn is column-parallel), in each of the 2 layers.
  const nlohmann::json plan = nlohmann::json::parse(r.out);
  EXPECT_EQ(plan["ranks"][0]["optimizer"].get<int64_t>(), 8 * 2 * (4 * 128 + 384 * 4 / 2)) << r.out;
  r = run("plan --lora-alpha 16");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--lora-alpha needs --lora-rank R"), std::string::npos) << r.out;
}
