// `shardwise tokenize` (train a SentencePiece model, text to token files and back) and `shardwise
// train --data text --tokenizer`, on tests/data/fables.txt: threads, a resume, and mpirun.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::run_command;

const std::string kFables = std::string(SHARDWISE_SOURCE_DIR) + "/tests/data/fables.txt";

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sw_cli_tokenize_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A model of vocabulary 512 trained on the fables, at test time: `d`/m.model.
std::string trained_model(const fs::path& d) {
  Result r = run("tokenize --train-model --in " + kFables + " --vocab-size 512 --model-prefix " + (d / "m").string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("vocabulary 512, bos 1, eos 2"), std::string::npos) << r.out;
  return (d / "m.model").string();
}

TEST(CliTokenize, TrainsAModelWritesTokenFilesAndDecodesThemBack) {
  fs::path d = fresh_dir("roundtrip");
  const std::string model = trained_model(d);
  ASSERT_TRUE(fs::exists(d / "m.vocab"));
  const std::string tok = "tokenize --tokenizer " + model + " --documents paragraphs --in " + kFables;
  Result r = run(tok + " --out " + (d / "t.bin").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("into 48 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("u16 format, uint16 tokens (train reads it with --data-format auto)"), std::string::npos) << r.out;
  Result back = run("tokenize --decode --tokenizer " + model + " --documents paragraphs --in " + (d / "t.bin").string() +
                    " --out " + (d / "back.txt").string());
  ASSERT_EQ(back.status, 0) << back.out;
  EXPECT_EQ(slurp(d / "back.txt"), slurp(kFables)) << "decode(encode(text)) == text";
  for (const std::string format : {"u32", "llmc"}) {
    const fs::path out = d / ("t_" + format + ".bin");
    Result w = run(tok + " --format " + format + " --out " + out.string());
    ASSERT_EQ(w.status, 0) << w.out;
    EXPECT_NE(w.out.find("wrote " + out.string() + ": " + format + " format"), std::string::npos) << w.out;
    Result b = run("tokenize --decode --tokenizer " + model + " --documents paragraphs --format " +
                   (format == "u32" ? "u32" : "auto") + " --in " + out.string() + " --out " + (d / "b.txt").string());
    ASSERT_EQ(b.status, 0) << b.out;
    EXPECT_EQ(slurp(d / "b.txt"), slurp(kFables)) << format;
  }
  // The token file trains as any other (--data-format auto).
  Result t = run("train --layers 1 --hidden 32 --heads 2 --seq 32 --vocab 512 --global-batch 4 --steps 2 --eval-every 0 "
                 "--run-dir " + (d / "run").string() + " --data " + (d / "t_llmc.bin").string());
  EXPECT_EQ(t.status, 0) << t.out;
  fs::remove_all(d);
}

const std::string kTrain = "train --layers 1 --hidden 32 --heads 2 --seq 32 --global-batch 4 --eval-every 0 ";

TEST(CliTokenize, TrainsOnTextThroughTheTokenizerAndResumesOnlyWithIt) {
  fs::path d = fresh_dir("train");
  const std::string model = trained_model(d);
  const std::string run_dir = " --run-dir " + (d / "run").string() + " --save-every 2";
  const std::string text = " --vocab 512 --data " + kFables + " --tokenizer " + model + " --documents paragraphs";
  Result r = run(kTrain + "--steps 2 --no-cross-document-attention" + run_dir + text);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data: " + kFables + " (text tokenized by " + model + ": 48 documents, one document per "
                       "paragraph, eos after each"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("packing: documents end at id 2"), std::string::npos) << r.out;
  // The same text as bytes is other data (the checkpoint's --tokenizer, --documents and
  // --no-cross-document-attention, which a resume takes, overridden).
  Result bytes = run(kTrain + "--steps 4 --vocab 512 --resume auto --data " + kFables + run_dir +
                     " --tokenizer '' --documents file --no-cross-document-attention=false");
  EXPECT_EQ(bytes.status, 2) << bytes.out;
  EXPECT_NE(bytes.out.find("tokenized by m.model"), std::string::npos) << bytes.out;
  Result again = run(kTrain + "--steps 4 --no-cross-document-attention --resume auto" + run_dir + text);
  EXPECT_EQ(again.status, 0) << again.out;
  fs::remove_all(d);
}

TEST(CliTokenize, GenerateEncodesTextPromptsAndDecodesTheOutput) {
  fs::path d = fresh_dir("generate");
  const std::string model = trained_model(d);
  Result r = run(kTrain + "--steps 2 --vocab 512 --save-every 2 --data " + kFables + " --tokenizer " + model +
                 " --run-dir " + (d / "run").string());
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string ckpt = (d / "run" / "checkpoints" / "checkpoint-2").string();
  // The checkpoint names the tokenizer's ids (unk 0, bos 1, eos 2, no pad: eos pads).
  for (const char* file : {"config.json", "generation_config.json"}) {
    const nlohmann::json c = nlohmann::json::parse(slurp(fs::path(ckpt) / file));
    EXPECT_EQ(c["bos_token_id"], 1) << file;
    EXPECT_EQ(c["eos_token_id"], 2) << file;
    EXPECT_EQ(c["pad_token_id"], 2) << file;
  }
  // The prompt's ids are the tokenizer's (checked against `tokenize`), and the printed text is the
  // decoded prompt and continuation.
  std::ofstream(d / "prompt.txt") << "The fox and the crow";
  Result ids = run("tokenize --tokenizer " + model + " --in " + (d / "prompt.txt").string() + " --out " +
                   (d / "prompt.bin").string() + " --no-eos-between-documents");
  ASSERT_EQ(ids.status, 0) << ids.out;
  const std::string bin = slurp(d / "prompt.bin");
  std::vector<int64_t> want;
  for (size_t i = 0; i + 1 < bin.size(); i += 2)
    want.push_back(static_cast<unsigned char>(bin[i]) | static_cast<unsigned char>(bin[i + 1]) << 8);
  Result g = run("generate --checkpoint " + ckpt + " --tokenizer " + model +
                 " --prompt 'The fox and the crow' --max-new-tokens 5 --json --mesh tp=2");
  ASSERT_EQ(g.status, 0) << g.out;
  const nlohmann::json j = nlohmann::json::parse(g.out.substr(g.out.find('{'), g.out.find('\n', g.out.find('{')) - g.out.find('{')));
  EXPECT_EQ(j["sequences"][0]["prompt_ids"].get<std::vector<int64_t>>(), want);
  EXPECT_EQ(j["sequences"][0]["prompt"], "The fox and the crow");
  EXPECT_TRUE(j["sequences"][0].contains("text"));
  // Without --tokenizer the checkpoint's copy encodes the prompt alike.
  Result kept = run("generate --checkpoint " + ckpt + " --prompt 'The fox and the crow' --max-new-tokens 5 --json");
  ASSERT_EQ(kept.status, 0) << kept.out;
  EXPECT_EQ(nlohmann::json::parse(kept.out.substr(0, kept.out.find('\n')))["sequences"][0]["prompt_ids"], want);
  // generation_config.json's eos list ends a sequence even where the tokenizer's eos (2) is another
  // id, as in transformers' generate (the tokenizer's eos used to win and the list was not read).
  const std::string again = "generate --checkpoint " + ckpt + " --prompt 'The fox and the crow' --max-new-tokens 8 --json";
  Result free_run = run(again + " --eos-id -1");
  ASSERT_EQ(free_run.status, 0) << free_run.out;
  const std::vector<int64_t> all =
      nlohmann::json::parse(free_run.out.substr(0, free_run.out.find('\n')))["sequences"][0]["new_ids"];
  ASSERT_EQ(all.size(), 8u);
  ASSERT_NE(all[0], 2);  // the list names the first new token and an id that is not the tokenizer's eos
  const int64_t other = all[0] == 3 ? 4 : 3;
  nlohmann::json gen = nlohmann::json::parse(slurp(fs::path(ckpt) / "generation_config.json"));
  gen["eos_token_id"] = {other, all[0]};
  std::ofstream(fs::path(ckpt) / "generation_config.json") << gen.dump();
  Result listed = run(again);
  ASSERT_EQ(listed.status, 0) << listed.out;
  EXPECT_EQ(nlohmann::json::parse(listed.out.substr(0, listed.out.find('\n')))["sequences"][0]["new_ids"],
            std::vector<int64_t>{all[0]});
  // Without any tokenizer a 512-token model takes ids only; a tokenizer larger than the model is refused.
  fs::copy(ckpt, d / "bare", fs::copy_options::recursive);
  fs::remove(d / "bare" / "tokenizer.model");
  Result no = run("generate --checkpoint " + (d / "bare").string() + " --prompt hello");
  EXPECT_EQ(no.status, 2) << no.out;
  EXPECT_NE(no.out.find("or the model's --tokenizer"), std::string::npos) << no.out;
  Result wide = run("generate --checkpoint " + std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf/gpt2_tiny --tokenizer " +
                    model + " --prompt hello");
  EXPECT_EQ(wide.status, 2) << wide.out;
  EXPECT_NE(wide.out.find("has a vocabulary of 512 ids; the model's holds 300"), std::string::npos) << wide.out;
  fs::remove_all(d);
}

TEST(CliTokenize, ErrorsAreOneLineNamingTheProblem) {
  fs::path d = fresh_dir("errors");
  Result missing = run(kTrain + "--steps 1 --vocab 512 --data " + kFables + " --tokenizer " + (d / "none.model").string());
  EXPECT_EQ(missing.status, 2) << missing.out;
  EXPECT_NE(missing.out.find("shardwise: error: --tokenizer '" + (d / "none.model").string() + "': no such file"),
            std::string::npos) << missing.out;
  const std::string model = trained_model(d);
  Result small = run(kTrain + "--steps 1 --vocab 256 --data " + kFables + " --tokenizer " + model);
  EXPECT_EQ(small.status, 2) << small.out;
  EXPECT_NE(small.out.find("has a vocabulary of 512 ids; the model's --vocab 256 must hold it (use --vocab 512 or more)"),
            std::string::npos) << small.out;
  Result no_model = run("tokenize --in " + kFables + " --out " + (d / "t.bin").string());
  EXPECT_EQ(no_model.status, 2) << no_model.out;
  EXPECT_NE(no_model.out.find("needs --tokenizer F"), std::string::npos) << no_model.out;
  Result no_eos = run(kTrain + "--steps 1 --vocab 512 --data " + kFables + " --no-cross-document-attention");
  EXPECT_EQ(no_eos.status, 2) << no_eos.out;
  EXPECT_NE(no_eos.out.find("--no-cross-document-attention needs an end-of-text id"), std::string::npos) << no_eos.out;
  Result tiny = run("tokenize --train-model --in " + kFables + " --vocab-size 100 --model-prefix " + (d / "t").string());
  EXPECT_EQ(tiny.status, 2) << tiny.out;
  EXPECT_NE(tiny.out.find("training a SentencePiece bpe tokenizer of vocabulary 100"), std::string::npos) << tiny.out;
  fs::remove_all(d);
}

std::vector<double> losses_of(const fs::path& jsonl) {
  std::ifstream f(jsonl);
  std::vector<double> out;
  for (std::string line; std::getline(f, line);) out.push_back(std::stod(line.substr(line.find("\"loss\":") + 7)));
  return out;
}

// Every process tokenizes the text itself; two processes train as two threads do.
TEST(CliTokenize, UnderMpirunEveryProcessReadsTheSameTokens) {
  fs::path d = fresh_dir("mpi");
  const std::string model = trained_model(d);
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args = " --mesh dp=2 --steps 3 --no-cross-document-attention --vocab 512 --data " + kFables +
                           " --tokenizer " + model + " --documents paragraphs";
  Result threads = run(kTrain + args + " --run-dir " + (d / "threads").string());
  ASSERT_EQ(threads.status, 0) << threads.out;
  Result mpi = run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 2 " + bin + " " + kTrain + args + " --run-dir " +
                           (d / "mpi").string());
  ASSERT_EQ(mpi.status, 0) << mpi.out;
  EXPECT_NE(mpi.out.find("(2 ranks, mpi)"), std::string::npos) << mpi.out;
  const std::vector<double> a = losses_of(d / "threads" / "metrics.jsonl"), b = losses_of(d / "mpi" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
  fs::remove_all(d);
}

}  // namespace
