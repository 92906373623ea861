// `shardwise train --lora-*`: a LoRA run on a shardwise-trained base saves PEFT's files (no model
// weights), reports optimizer state for the adapters only, resumes on another mesh, and its
// adapters merged by `ckpt lora-merge` into that (GPT-2-layout) checkpoint give the adapted model's
// loss; PEFT's golden adapter (tests/golden/hf/lora_gpt2) trains on 4 MPI processes from PEFT's
// loss; and the errors of the --lora-* options are one line naming the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::run;
using shardwise_cli_test::run_command;

const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

struct TempDir : shardwise_cli_test::TempDir {
  explicit TempDir(const std::string& name) : shardwise_cli_test::TempDir("sw_cli_lora_" + name) {}
};

double first_loss(const fs::path& run_dir) {
  std::ifstream f(run_dir / "metrics.jsonl");
  std::string line;
  std::getline(f, line);
  return nlohmann::json::parse(line)["loss"].get<double>();
}

std::string train(const fs::path& run_dir, const std::string& mesh, int steps) {
  return "train --mesh " + mesh + " --steps " + std::to_string(steps) +
         " --global-batch 8 --digits 2 --eval-every 0 --progress none --run-dir " + run_dir.string();
}

TEST(CliLora, RunOnAShardwiseBaseSavesPeftFilesResumesAndMerges) {
  TempDir d("run");
  // The base: a shardwise checkpoint (GPT-2's layout) of the addition task.
  auto r = run(train(d.path / "base", "dp=1", 2) + " --layers 2 --hidden 32 --save-every 2");
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path base = d.path / "base" / "checkpoints" / "checkpoint-2";
  const std::string lora = " --init-from " + base.string() + " --lora-rank 4 --lora-targets c_attn,c_proj --lr 1e-2";
  r = run(train(d.path / "lora", "dp=1", 4) + lora + " --save-every 2");
  ASSERT_EQ(r.status, 0) << r.out;
  // Adapters per layer (H 32, r 4): c_attn 4x32 + 96x4, attn.c_proj 4x32 + 32x4, mlp.c_proj 4x128 + 32x4.
  EXPECT_NE(r.out.find("LoRA: r 4, alpha 8 (scale 2) on c_attn, c_proj; base frozen: 2816 trainable parameters"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer state 22528 bytes (adapters only"), std::string::npos) << r.out;  // 8 x 2816
  const fs::path ckpt = d.path / "lora" / "checkpoints" / "checkpoint-4";
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json", "trainer_state.json", "manifest.json"})
    EXPECT_TRUE(fs::exists(ckpt / f)) << f;
  for (const char* f : {"config.json", "model.safetensors.index.json", "master_weights.safetensors.index.json"})
    EXPECT_FALSE(fs::exists(ckpt / f)) << f;
  r = run("ckpt verify " + ckpt.string());
  EXPECT_EQ(r.status, 0) << r.out;
  // Resumed on another mesh (the base again from --init-from).
  r = run(train(d.path / "lora", "dp=2,tp=2", 6) + lora + " --save-every 2 --resume auto");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + ckpt.string() + " at step 4"), std::string::npos) << r.out;
  // Merged into the base checkpoint: the merged model's loss is the adapted one's.
  const fs::path merged = d.path / "merged";
  r = run("ckpt lora-merge " + base.string() + " " + ckpt.string() + " " + merged.string());
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(train(d.path / "adapted", "dp=1", 1) + " --init-from " + base.string() + " --lora-from " + ckpt.string());
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(train(d.path / "merged-run", "tp=2", 1) + " --init-from " + merged.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const double adapted = first_loss(d.path / "adapted");
  EXPECT_NEAR(first_loss(d.path / "merged-run"), adapted, 1e-5 * adapted);
  EXPECT_NE(adapted, first_loss(d.path / "lora"));  // the adapters changed the model
}

// A LoRA checkpoint records its base's fingerprint: lora-merge into another base (other weights of
// the same shape) is refused naming the adapter, its base and the base given; --skip-base-check
// merges anyway; the adapter's own base merges.
TEST(CliLora, MergeRefusesABaseTheAdapterWasNotTrainedOn) {
  TempDir d("base_check");
  const std::string gpt2 = " --init-from " + kGolden + "/gpt2_tiny --data " + kGolden + "/tokens.bin";
  auto r = run(train(d.path / "other", "dp=1", 1) + gpt2 + " --save-every 1 --lr 0.1");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(train(d.path / "lora", "dp=1", 1) + gpt2 + " --lora-rank 2 --save-every 1");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string other = (d.path / "other" / "checkpoints" / "checkpoint-1").string(),
                    adapter = (d.path / "lora" / "checkpoints" / "checkpoint-1").string();
  r = run("ckpt lora-merge " + other + " " + adapter + " " + (d.path / "merged").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("lora-merge: adapter " + adapter + " was trained on the base model '" + kGolden +
                       "/gpt2_tiny', and base " + other + " is another model or holds other weights"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pass --skip-base-check to merge anyway"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.path / "merged"));
  r = run("ckpt lora-merge " + other + " " + adapter + " " + (d.path / "merged").string() + " --skip-base-check");
  EXPECT_EQ(r.status, 0) << r.out;
  r = run("ckpt lora-merge " + kGolden + "/gpt2_tiny " + adapter + " " + (d.path / "merged-own").string());
  EXPECT_EQ(r.status, 0) << r.out;
}

// generate on an adapter directory names it and the lora-merge to run (the base from its
// adapter_config.json), and that command, then generate on its output, work.
TEST(CliLora, GenerateOnAnAdapterDirectoryShowsTheMergeCommand) {
  TempDir d("generate");
  auto r = run(train(d.path / "lora", "dp=1", 1) + " --init-from " + kGolden + "/gpt2_tiny --data " + kGolden +
               "/tokens.bin --lora-rank 2 --save-every 1");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string adapter = (d.path / "lora" / "checkpoints" / "checkpoint-1").string(),
                    merged = (d.path / "lora" / "merged-checkpoint-1").string();
  r = run("generate --checkpoint " + adapter + " --prompt-ids 1,2 --max-new-tokens 2");
  EXPECT_EQ(r.status, 2) << r.out;
  const std::string merge = "ckpt lora-merge " + kGolden + "/gpt2_tiny " + adapter + " " + merged;
  EXPECT_NE(r.out.find("--checkpoint " + adapter + " holds LoRA adapters (adapter_config.json), not a model: merge "
                       "them into their base model first, `shardwise " + merge + "`, then generate with "
                       "--checkpoint " + merged), std::string::npos) << r.out;
  ASSERT_EQ(run(merge).status, 0);
  r = run("generate --checkpoint " + merged + " --prompt-ids 1,2 --max-new-tokens 2");
  EXPECT_EQ(r.status, 0) << r.out;
  r = run("generate --checkpoint " + kGolden + "/lora_gpt2 --prompt-ids 1,2");  // PEFT's: its base as PEFT names it
  EXPECT_NE(r.out.find("`shardwise ckpt lora-merge gpt2_tiny " + kGolden + "/lora_gpt2 " + kGolden + "/lora_gpt2-merged`"),
            std::string::npos) << r.out;
}

std::string file_bytes(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A bare GPT-2 adapter (adapter_model.safetensors alone, or a directory without adapter_config.json,
// with --rank and --alpha) merges in GPT-2's Conv1D layout, which the base's config.json names: the
// same weights as the merge of PEFT's directory (rsLoRA: alpha 8 / sqrt(4) = 16 / 4).
TEST(CliLora, ABareGpt2AdapterMergesInConv1DLayout) {
  TempDir d("bare");
  auto r = run("ckpt lora-merge " + kGolden + "/gpt2_tiny " + kGolden + "/lora_gpt2 " + (d.path / "peft").string());
  ASSERT_EQ(r.status, 0) << r.out;
  fs::create_directories(d.path / "bare");
  fs::copy_file(kGolden + "/lora_gpt2/adapter_model.safetensors", d.path / "bare" / "adapter_model.safetensors");
  for (const fs::path& adapter : {d.path / "bare" / "adapter_model.safetensors", d.path / "bare"}) {
    const fs::path out = d.path / ("merged-" + adapter.filename().string());
    r = run("ckpt lora-merge " + kGolden + "/gpt2_tiny " + adapter.string() + " " + out.string() + " --rank 4 --alpha 16");
    ASSERT_EQ(r.status, 0) << adapter << "\n" << r.out;
    EXPECT_NE(r.out.find("merged 8 adapted weights"), std::string::npos) << r.out;
    EXPECT_EQ(file_bytes(out / "model-00001-of-00001.safetensors"),
              file_bytes(d.path / "peft" / "model-00001-of-00001.safetensors")) << adapter;
  }
}

TEST(CliLora, PeftsAdapterTrainsOnMpiProcessesFromPeftsLoss) {
  TempDir d("mpi");
  std::ifstream f(kGolden + "/lora_gpt2_expected.json");
  const double want = nlohmann::json::parse(f)["loss"].get<double>();
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  auto r = run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --init-from " + kGolden +
                       "/gpt2_tiny --lora-from " + kGolden + "/lora_gpt2 --data " + kGolden +
                       "/tokens.bin --mesh dp=2,tp=2 --steps 2 --global-batch 4 --eval-every 0 --progress none "
                       "--save-every 2 --run-dir " + d.path.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NEAR(first_loss(d.path), want, 1e-5 * want);
  EXPECT_TRUE(fs::exists(d.path / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"));
}

// LoRA on a transformers Llama (tests/golden/hf/llama_tiny: H 16, 2 kv heads of 4, MLP 32):
// all-linear adapters train on dp=2 x tp=2 and save PEFT's files for nn.Linear (fan_in_fan_out
// false, all-linear saved as the 14 module paths); merged by `ckpt lora-merge` they give the
// adapted model's loss. A Mixtral (mixtral_tiny) trains PEFT's default q_proj/v_proj adapters and
// refuses a target inside its MoE blocks, naming it.
TEST(CliLora, LlamaAdaptersTrainSavePeftFilesAndMerge) {
  TempDir d("llama");
  const std::string base = kGolden + "/llama_tiny";
  auto llama = [&](const fs::path& dir, const std::string& mesh, const std::string& args) {
    return "train --mesh " + mesh + " --steps 2 --global-batch 4 --eval-every 0 --progress none --run-dir " +
           dir.string() + " --data " + kGolden + "/llama_tokens.bin --lr 1e-2" + args;
  };
  auto r = run(llama(d.path / "lora", "dp=2,tp=2",
                     " --init-from " + base + " --lora-rank 4 --lora-targets all-linear --save-every 2"));
  ASSERT_EQ(r.status, 0) << r.out;
  // Per layer, r 4: q, o 4x16 + 16x4; k, v 4x16 + 8x4; gate, up 4x16 + 32x4; down 4x32 + 16x4.
  EXPECT_NE(r.out.find("LoRA: r 4, alpha 8 (scale 2) on all-linear; base frozen: 2048 trainable parameters"),
            std::string::npos) << r.out;
  const fs::path ckpt = d.path / "lora" / "checkpoints" / "checkpoint-2";
  std::ifstream in(ckpt / "adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["fan_in_fan_out"], false);
  EXPECT_EQ(config["target_modules"].size(), 14u) << config.dump();
  EXPECT_EQ(config["base_model_name_or_path"], base);
  r = run(llama(d.path / "adapted", "dp=1", " --init-from " + base + " --lora-from " + ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.out;
  // The saved list is the modules all-linear resolved to: --lora-targets all-linear agrees with it,
  // and a list of other modules does not.
  const std::string from = " --init-from " + base + " --lora-from " + ckpt.string() + " --dry-run --lora-targets ";
  r = run(llama(d.path / "same", "dp=1", from + "all-linear"));
  EXPECT_EQ(r.status, 0) << r.out;
  r = run(llama(d.path / "other", "dp=1", from + "q_proj,v_proj"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--lora-targets q_proj,v_proj contradicts --lora-from"), std::string::npos) << r.out;
  r = run("ckpt lora-merge " + base + " " + ckpt.string() + " " + (d.path / "merged").string());
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(llama(d.path / "merged-run", "tp=2", " --init-from " + (d.path / "merged").string()));
  ASSERT_EQ(r.status, 0) << r.out;
  const double adapted = first_loss(d.path / "adapted");
  EXPECT_NEAR(first_loss(d.path / "merged-run"), adapted, 1e-5 * adapted);
  EXPECT_NE(adapted, first_loss(d.path / "lora"));  // the adapters changed the model
  const std::string mixtral = " --init-from " + kGolden + "/mixtral_tiny --lora-rank 2";
  r = run(llama(d.path / "moe", "dp=1", mixtral));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("LoRA: r 2, alpha 8 (scale 4) on q_proj, v_proj"), std::string::npos) << r.out;
  r = run(llama(d.path / "experts", "dp=1", mixtral + " --lora-targets q_proj,experts"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--lora-targets 'experts' names 'model.layers.0.mlp.experts', which LoRA does not adapt here: "
                       "a mixture-of-experts block"), std::string::npos) << r.out;
}

TEST(CliLora, BadLoraOptionsAreOneLineNamingTheProblem) {
  TempDir d("bad");
  const std::string golden = " --init-from " + kGolden + "/gpt2_tiny --data " + kGolden + "/tokens.bin";
  auto expect_error = [&](const std::string& args, const std::string& message, int steps = 1) {
    auto r = run(train(d.path, "dp=1", steps) + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
  };
  expect_error(" --lora-rank 4", "--lora-rank 4 trains adapters on a base model, whose weights stay frozen: pass "
                                 "--init-from DIR");
  expect_error(golden + " --lora-rank 0", "--lora-rank must be at least 1, got 0");
  expect_error(golden + " --lora-rank -3", "--lora-rank must be at least 1, got -3");
  expect_error(golden + " --lora-rank 4 --lora-targets c_attn,q_proj", "--lora-targets 'q_proj' names no module");
  expect_error(golden + " --lora-rank 4 --lora-targets ln_f", "names 'transformer.ln_f', which LoRA does not adapt");
  expect_error(golden + " --lora-alpha 16", "--lora-alpha needs --lora-rank R (or --lora-from an adapter directory)");
  expect_error(golden + " --lora-from " + kGolden + "/lora_gpt2 --lora-rank 8",
               "--lora-rank 8 contradicts --lora-from " + kGolden + "/lora_gpt2, whose adapter_config.json has r 4");
  expect_error(golden + " --lora-from " + kGolden + "/gpt2_tiny", "has no adapter_config.json");
  // An adapter whose config says r 2 over rank-4 matrices: both shapes named.
  fs::create_directories(d.path / "bad");
  fs::copy_file(kGolden + "/lora_gpt2/adapter_model.safetensors", d.path / "bad" / "adapter_model.safetensors");
  std::ifstream in(kGolden + "/lora_gpt2/adapter_config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["r"] = 2;
  std::ofstream(d.path / "bad" / "adapter_config.json") << config.dump(2);
  expect_error(golden + " --lora-from " + (d.path / "bad").string(), "has shape 4x32 in the checkpoint");
  // A LoRA checkpoint resumed without its adapters, or on another base.
  auto r = run(train(d.path / "run", "dp=1", 1) + golden + " --lora-rank 2 --save-every 1");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string ckpt = (d.path / "run" / "checkpoints" / "checkpoint-1").string();
  // Its run_options.json gives the resume its --lora-* options; a checkpoint without one (an older
  // shardwise's) resumed without them is refused.
  r = run(train(d.path, "dp=1", 2) + golden + " --resume " + ckpt);
  EXPECT_EQ(r.status, 0) << r.out;
  fs::remove_all(d.path / "checkpoints");
  const fs::path old = d.path / "older";
  fs::copy(ckpt, old, fs::copy_options::recursive);
  fs::remove(old / "run_options.json");
  expect_error(golden + " --resume " + old.string() + " --no-verify-resume",
               "holds LoRA adapters (adapter_config.json), not a model", 2);
  expect_error(golden + " --lora-rank 4 --lora-targets c_attn,c_fc --resume " + ckpt,
               "holds other adapters: r 2 (checkpoint) vs 4 (this run), target_modules [c_attn] (checkpoint) vs "
               "[c_attn, c_fc] (this run)", 2);
  r = run(train(d.path / "other", "dp=1", 1) + " --init-from " + kGolden + "/gpt2_tiny --data " + kGolden +
          "/tokens.bin --save-every 1 --lr 0.1");
  ASSERT_EQ(r.status, 0) << r.out;
  expect_error(" --init-from " + (d.path / "other" / "checkpoints" / "checkpoint-1").string() + " --data " + kGolden +
                   "/tokens.bin --lora-rank 2 --resume " + ckpt,
               "trained its adapters on the base model '" + kGolden + "/gpt2_tiny'", 2);
}

}  // namespace
