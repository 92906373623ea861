// The SentencePiece tokenizer (a small model trained here, at test time, on tests/data/fables.txt),
// documents, token files written and read back, and training on text through a tokenizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/data/data.h"
#include "shardwise/data/tokenize.h"
#include "shardwise/data/tokenizer.h"
#include "shardwise/train/trainer.h"
#include "tests/support/error_of.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

const std::string kFables = std::string(SHARDWISE_SOURCE_DIR) + "/tests/data/fables.txt";

// Per process: ctest runs the cases as parallel processes, each training its own model, and two
// writing one path raced ("unk is not defined" from a half-written model).
fs::path scratch() {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("shardwise-tokenizer-" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() { fs::remove_all(path); }  // at exit
  };
  static const Dir d;
  return d.path;
}

// Trained once per process (each ctest process trains its own: about a second).
const std::string& fables_model() {
  static const std::string model = train_tokenizer({{kFables}, (scratch() / "fables").string(), 512, "bpe"});
  return model;
}

DocumentOptions cut(DocumentSplit split, std::string separator = "", bool eos = true) {
  return DocumentOptions{split, std::move(separator), eos};
}

TEST(Tokenizer, DecodeOfEncodeGivesTheTextBack) {
  const Tokenizer t(fables_model());
  const std::string text = read_text_file(kFables);
  const std::vector<int64_t> ids = t.encode(text);
  EXPECT_LT(ids.size(), text.size() / 2) << "a trained vocabulary holds pieces longer than one byte";
  EXPECT_EQ(t.decode(ids), text);
  // Text it never saw: characters outside the training text fall back to bytes; spaces, tabs and
  // line breaks are kept as they are.
  for (const std::string s : {"naïve façade — 2,50 € • 日本語 🙂", "  two  spaces,\ttab\nand\n\nbreaks\n", "x", ""})
    EXPECT_EQ(t.decode(t.encode(s)), s) << s;
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pad_id(), -1);
  EXPECT_EQ(t.piece(2), "</s>");
  EXPECT_EQ(t.decode(std::vector<int64_t>{t.bos_id(), t.eos_id()}), "") << "control ids decode to nothing";
  EXPECT_NE(t.describe().find("vocabulary 512, bos 1, eos 2"), std::string::npos) << t.describe();
}

TEST(Tokenizer, ErrorsNameTheFileOrTheId) {
  EXPECT_NE(error_of([] { Tokenizer("/nonexistent/tokenizer.model"); }).find("'/nonexistent/tokenizer.model': no such file"),
            std::string::npos);
  const fs::path junk = scratch() / "junk.model";
  std::ofstream(junk) << "this is not a protobuf";
  EXPECT_NE(error_of([&] { Tokenizer(junk.string()); }).find("is not a SentencePiece model"), std::string::npos);
  const Tokenizer t(fables_model());
  const std::string e = error_of([&] { t.decode(std::vector<int64_t>{5, 512}); });
  EXPECT_NE(e.find("token id 512 is outside the vocabulary"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { t.decode(std::vector<int64_t>{-1}); }).find("token id -1"), std::string::npos);
  // SentencePiece's own message when the text cannot fill the vocabulary asked for.
  const std::string big = error_of([] { train_tokenizer({{kFables}, (scratch() / "big").string(), 100000, "bpe"}); });
  EXPECT_NE(big.find("tokenizer of vocabulary 100000 on"), std::string::npos) << big;
  EXPECT_NE(big.find("Vocabulary size too high"), std::string::npos) << big;
}

TEST(Tokenizer, DocumentsAreFilesLinesParagraphsOrBetweenSeparators) {
  const std::string text = "one\ntwo\n\n \nthree\r\n\nfour<|endoftext|>\nfive\n";
  using V = std::vector<std::string_view>;
  EXPECT_EQ(split_documents(text, cut(DocumentSplit::File)), (V{text}));
  EXPECT_EQ(split_documents(text, cut(DocumentSplit::Lines)), (V{"one", "two", "three", "four<|endoftext|>", "five"}));
  EXPECT_EQ(split_documents(text, cut(DocumentSplit::Paragraphs)), (V{"one\ntwo", "three\r", "four<|endoftext|>\nfive"}));
  EXPECT_EQ(split_documents(text, cut(DocumentSplit::File, "<|endoftext|>")),
            (V{"one\ntwo\n\n \nthree\r\n\nfour", "five"}));
  EXPECT_TRUE(split_documents("", cut(DocumentSplit::File)).empty());
  EXPECT_EQ(parse_document_split("paragraphs"), DocumentSplit::Paragraphs);
  EXPECT_THROW(parse_document_split("pages"), Error);
}

TEST(Tokenizer, EveryDocumentIsEncodedAloneAndEndsWithEos) {
  const Tokenizer t(fables_model());
  const std::string text = read_text_file(kFables);
  const TokenizedText tt = tokenize_text(t, text, cut(DocumentSplit::Paragraphs));
  EXPECT_EQ(tt.documents, 48);
  std::vector<std::string_view> docs = split_documents(text, cut(DocumentSplit::Paragraphs));
  ASSERT_EQ(docs.size(), 48u);
  size_t k = 0;
  std::vector<int64_t> doc;
  for (uint32_t id : tt.tokens) {
    if (id != 2) {
      doc.push_back(id);
      continue;
    }
    ASSERT_LT(k, docs.size());
    EXPECT_EQ(doc, t.encode(docs[k])) << "document " << k;
    EXPECT_EQ(t.decode(doc), docs[k]) << "document " << k;
    doc.clear(), ++k;
  }
  EXPECT_EQ(k, 48u) << "one eos per document";
  EXPECT_TRUE(doc.empty()) << "the last document ends with eos too";
  EXPECT_EQ(tokenize_text(t, text, cut(DocumentSplit::Paragraphs, "", false)).tokens.size(), tt.tokens.size() - 48);
  EXPECT_EQ(tt.max_id + 1, std::max<int64_t>(*std::max_element(tt.tokens.begin(), tt.tokens.end()) + 1, 0));
}

// Files written in every format, read back by TokenFile (--data-format auto where it can tell).
TEST(Tokenizer, TokenFilesReadBackToTheSameIds) {
  const Tokenizer t(fables_model());
  const TokenizedText tt = tokenize_text(t, read_text_file(kFables), cut(DocumentSplit::Paragraphs));
  auto read_back = [](const fs::path& p, TokenFormat f) {
    const TokenFile file(p.string(), 0, 0, f);
    std::vector<uint32_t> ids;
    for (int64_t i = 0; i < file.token_count(); ++i) ids.push_back(static_cast<uint32_t>(file.token(0, i)));
    return std::pair{ids, file.format()};
  };
  struct Case {
    TokenFormat asked;
    int64_t vocab;
    TokenFormat read_as, detected;
  };
  for (const Case& k : {Case{TokenFormat::Auto, 512, TokenFormat::Auto, TokenFormat::U16},
                        Case{TokenFormat::U16, 512, TokenFormat::Auto, TokenFormat::U16},
                        Case{TokenFormat::Llmc, 512, TokenFormat::Auto, TokenFormat::Llmc},
                        Case{TokenFormat::U32, 512, TokenFormat::U32, TokenFormat::U32},
                        Case{TokenFormat::Auto, 70000, TokenFormat::Auto, TokenFormat::Llmc},  // uint32 llm.c
                        Case{TokenFormat::Llmc, 70000, TokenFormat::Auto, TokenFormat::Llmc}}) {
    const fs::path p = scratch() / fmt::format("fables-{}-{}.bin", token_format_name(k.asked), k.vocab);
    const TokenFormat written = write_token_file(p.string(), tt.tokens, k.asked, k.vocab);
    EXPECT_EQ(written, k.asked == TokenFormat::Auto ? k.detected : k.asked);
    auto [ids, format] = read_back(p, k.read_as);
    EXPECT_EQ(ids, tt.tokens) << p;
    EXPECT_EQ(format, k.detected) << p;
    const auto header = k.detected == TokenFormat::Llmc ? 1024u : 0u;
    const auto width = k.vocab > 65536 || k.asked == TokenFormat::U32 ? 4u : 2u;
    EXPECT_EQ(fs::file_size(p), header + width * tt.tokens.size()) << p;
  }
  const std::string narrow = error_of([&] { write_token_file((scratch() / "x.bin").string(), tt.tokens, TokenFormat::U16, 70000); });
  EXPECT_NE(narrow.find("--format u16 holds ids below 65536"), std::string::npos) << narrow;
  EXPECT_THROW(write_token_file((scratch() / "x.bin").string(), tt.tokens, TokenFormat::Bytes, 512), Error);
}

TrainConfig text_config(const std::string& mesh) {
  TrainConfig c;
  c.model.layers = 1, c.model.heads = 2, c.model.hidden = 32, c.model.seq = 32, c.model.vocab = 512;
  c.parallel.mesh = mesh;
  c.optimizer.steps = 2;
  c.optimizer.global_batch = 4;
  c.data.files = kFables;
  c.data.tokenizer = fables_model();
  c.data.documents = "paragraphs";
  return c;
}

TEST(Tokenizer, TrainingOnTextReadsTheTokenizersIds) {
  TrainConfig c = text_config("dp=2");
  c.data.val_fraction = 0.1;
  const Tokenizer t(fables_model());
  const TokenizedText tt = tokenize_text(t, read_text_file(kFables), cut(DocumentSplit::Paragraphs));
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    Trainer trainer(c, w.group(w.members()));
    for (int s = 0; s < 2; ++s) EXPECT_TRUE(std::isfinite(trainer.step().loss));
    EXPECT_TRUE(std::isfinite(trainer.validate().loss));
    if (w.rank() != 0) return;
    EXPECT_EQ(trainer.config().data.eos_id, 2) << "the tokenizer's eos";
    const std::string d = trainer.dataset().describe();
    EXPECT_NE(d.find("text tokenized by " + fables_model() + ": 48 documents"), std::string::npos) << d;
    // Each training window is a run of the tokenized text.
    const auto* file = dynamic_cast<const TokenFile*>(&trainer.dataset());
    ASSERT_NE(file, nullptr);
    EXPECT_EQ(file->token_count(), static_cast<int64_t>(tt.tokens.size()) - std::llround(0.1 * tt.tokens.size()));
    for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(file->token(0, i), tt.tokens[static_cast<size_t>(i)]);
  });
}

TEST(Tokenizer, TrainingRefusesASmallVocabularyAndTokenFileOptions) {
  TrainConfig c = text_config("dp=1");
  c.model.vocab = 300;
  std::string e = error_of([&] { c.check(1); });
  EXPECT_NE(e.find("has a vocabulary of 512 ids; the model's --vocab 300 must hold it"), std::string::npos) << e;
  c = text_config("dp=1");
  c.data.format = "u16";
  e = error_of([&] { c.check(1); });
  EXPECT_NE(e.find("--data-format u16 names a token file format"), std::string::npos) << e;
  c = text_config("dp=1");
  c.data.eos_id = 5;
  e = error_of([&] { c.check(1); });
  EXPECT_NE(e.find("--eos-id 5 contradicts --tokenizer"), std::string::npos) << e;
  c = text_config("dp=1");
  c.data.tokenizer.clear();
  e = error_of([&] { c.check(1); });
  EXPECT_NE(e.find("--documents and --document-separator cut raw text for --tokenizer"), std::string::npos) << e;
  c = text_config("dp=1");
  c.data.tokenizer = "/nonexistent.model";
  e = error_of([&] { c.check(1); });
  EXPECT_NE(e.find("--tokenizer '/nonexistent.model': no such file"), std::string::npos) << e;
}

}  // namespace
}  // namespace shardwise::train
