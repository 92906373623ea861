#include "shardwise/cli/generate/tokenize_cmd.h"

#include <filesystem>
#include <fstream>

#include "shardwise/core/error.h"
#include "shardwise/data/data.h"
#include "shardwise/data/tokenize.h"
#include "shardwise/data/tokenizer.h"
#include "shardwise/core/plural.h"

namespace shardwise::cli {

std::unique_ptr<TokenizeCommand> add_tokenize_command(CLI::App& app) {
  auto c = std::make_unique<TokenizeCommand>();
  TokenizeCommand& o = *c;
  auto* t = app.add_subcommand(
      "tokenize", "Text to a token file through a SentencePiece tokenizer.model (or back with --decode; "
                  "--train-model trains a small model)");
  t->option_defaults()->always_capture_default();
  t->add_option("--tokenizer", o.tokenizer, "a SentencePiece model (tokenizer.model, as Llama's)");
  t->add_option("--in", o.inputs, "text files (with --decode: token files), concatenated in order")->expected(1, -1);
  t->add_option("--out", o.output, "the token file to write (with --decode: the text file)");
  t->add_option("--format", o.format,
                "auto (u16 when the vocabulary fits in 65536 ids, else llm.c's header with uint32 tokens), u16, "
                "u32 (headerless: read back with --data-format u32) or llmc (llm.c's header)")
      ->check(CLI::IsMember({"auto", "u16", "u32", "llmc"}));
  t->add_option("--documents", o.documents,
                "how the text is cut into documents: file (each file one), lines (each non-blank line), "
                "paragraphs (separated by blank lines)")
      ->check(CLI::IsMember({"file", "lines", "paragraphs"}));
  t->add_option("--document-separator", o.separator,
                "documents are the text between occurrences of this string (e.g. '<|endoftext|>'); overrides "
                "--documents");
  t->add_flag("--eos-between-documents,!--no-eos-between-documents", o.eos,
              "put the tokenizer's end-of-text id after every document (the default)");
  t->add_flag("--decode", o.decode, "read token files (--in) and write their text (--out); documents end at eos");
  t->add_flag("--train-model", o.train_model,
              "train a SentencePiece model on the text files (--in) and write P.model and P.vocab (--model-prefix)");
  t->add_option("--vocab-size", o.vocab_size, "--train-model: the vocabulary (at least 259 with byte fallback)");
  t->add_option("--model-prefix", o.model_prefix, "--train-model: where the model goes (P.model, P.vocab)");
  t->add_option("--model-type", o.model_type, "--train-model: bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  o.cmd = t;
  return c;
}

namespace {

std::string human_bytes(uint64_t n) {
  return n < 10240 ? fmt::format("{} bytes", n) : fmt::format("{:.1f} KiB", static_cast<double>(n) / 1024);
}

int train_model(const TokenizeCommand& o, std::ostream& out) {
  SW_CHECK(o.tokenizer.empty() && o.output.empty(),
           "--train-model writes <--model-prefix>.model; --tokenizer and --out belong to tokenizing: run "
           "`shardwise tokenize` again with the new model");
  train::TokenizerTraining t{o.inputs, o.model_prefix, o.vocab_size, o.model_type};
  const std::string model = train::train_tokenizer(t);
  const train::Tokenizer trained(model);
  out << fmt::format("trained a SentencePiece {} tokenizer on {}: {}\n  wrote {} and {}.vocab\n", o.model_type,
                     fmt::join(o.inputs, ", "), trained.describe(), model, o.model_prefix);
  return 0;
}

// What ends a decoded document: the inverse of the --documents cut.
std::string document_joiner(const train::DocumentOptions& d) {
  if (!d.separator.empty()) return "\n" + d.separator + "\n";
  if (d.split == train::DocumentSplit::Lines) return "\n";
  if (d.split == train::DocumentSplit::Paragraphs) return "\n\n";
  return "";
}

int decode(const TokenizeCommand& o, const train::Tokenizer& tok, const train::DocumentOptions& d, std::ostream& out) {
  std::vector<std::string> docs;
  int64_t tokens = 0;
  for (const std::string& in : o.inputs) {
    const train::TokenFile file(in, 0, 0, train::parse_token_format(o.format));
    std::vector<int64_t> doc;
    for (int64_t i = 0; i < file.token_count(); ++i) {
      const int64_t id = file.token(0, i);
      if (id != tok.eos_id()) doc.push_back(id);
      if (id == tok.eos_id() || i + 1 == file.token_count()) docs.push_back(tok.decode(doc)), doc.clear();
    }
    tokens += file.token_count();
  }
  const std::string joiner = document_joiner(d);
  std::string text;
  for (size_t k = 0; k < docs.size(); ++k) text += (k ? joiner : "") + docs[k];
  if (!docs.empty() && (d.split != train::DocumentSplit::File || !d.separator.empty())) text += "\n";
  std::ofstream f(o.output, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  SW_CHECK(f.good(), "cannot write the text file '{}'", o.output);
  out << fmt::format("decoded {} into {} ({}) with {}\n  wrote {}\n", counted(tokens, "token"),
                     counted(static_cast<int64_t>(docs.size()), "document"),
                     human_bytes(text.size()), tok.describe(), o.output);
  return 0;
}

}  // namespace

int TokenizeCommand::run(std::ostream& out) const {
  SW_CHECK(!inputs.empty(), "`shardwise tokenize` needs --in: the text files to read");
  if (train_model) return cli::train_model(*this, out);
  SW_CHECK(!tokenizer.empty(),
           "`shardwise tokenize` needs --tokenizer F (a SentencePiece tokenizer.model), or --train-model to train one");
  SW_CHECK(!output.empty(), "`shardwise tokenize` needs --out: the {} file to write", decode ? "text" : "token");
  const train::Tokenizer tok(tokenizer);
  const train::DocumentOptions d{train::parse_document_split(documents), separator, eos};
  if (decode) return cli::decode(*this, tok, d, out);
  std::vector<uint32_t> tokens;
  int64_t docs = 0;
  uint64_t bytes = 0;
  for (const std::string& in : inputs) {
    const std::string text = train::read_text_file(in);
    train::TokenizedText t = train::tokenize_text(tok, text, d);
    tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
    docs += t.documents;
    bytes += text.size();
  }
  const train::TokenFormat written =
      train::write_token_file(output, tokens, train::parse_token_format(format), tok.vocab_size());
  const bool wide = written == train::TokenFormat::U32 ||
                    (written == train::TokenFormat::Llmc && tok.vocab_size() > 65536);
  // --data-format auto tells llm.c's header by its magic and headerless uint16 by the name *.bin.
  const std::string read_as = written == train::TokenFormat::U32                                ? "u32"
                              : written == train::TokenFormat::U16 && !output.ends_with(".bin") ? "u16"
                                                                                                : "auto";
  out << fmt::format("tokenized {} ({}) into {}, {} ({}) with {}\n",
                     counted(static_cast<int64_t>(inputs.size()), "file"), human_bytes(bytes), counted(docs, "document"),
                     counted(static_cast<int64_t>(tokens.size()), "token"), d.describe(), tok.describe());
  out << fmt::format("  wrote {}: {} format, uint{} tokens (train reads it with --data-format {})\n", output,
                     train::token_format_name(written), wide ? 32 : 16, read_as);
  return 0;
}

}  // namespace shardwise::cli
