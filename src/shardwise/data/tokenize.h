#pragma once
// Raw text to token ids through a Tokenizer (`shardwise tokenize`, and `train --data text.txt
// --tokenizer tokenizer.model`). A text is cut into documents, each encoded on its own (one
// SentencePiece call per document) and followed by the tokenizer's end-of-text id, so that packed
// windows see where documents end (packing.h).
//
// Documents (DocumentOptions):
//   file        the whole text is one document (the default)
//   lines       every line that is not blank, without its line break
//   paragraphs  runs of lines that are not blank, separated by one or more blank lines (lines of
//               spaces, tabs or '\r' only); the paragraph's inner line breaks are kept
//   separator   (when non-empty, instead of the above) the text between occurrences of the string,
//               e.g. "<|endoftext|>", without the line breaks next to it; empty pieces are dropped
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/data/tokenizer.h"

namespace shardwise::train {

enum class DocumentSplit { File, Lines, Paragraphs };
// "file", "lines", "paragraphs"; Error otherwise.
DocumentSplit parse_document_split(const std::string& name);
std::string document_split_name(DocumentSplit split);

struct DocumentOptions {
  DocumentSplit split = DocumentSplit::File;
  std::string separator;  // non-empty: documents are the text between its occurrences
  bool eos = true;        // the tokenizer's eos after every document (Error when it has none)
  std::string describe() const;  // "paragraphs, eos after each", "separated by '<|endoftext|>'", ...
};

// The documents of `text` (views into it), in order.
std::vector<std::string_view> split_documents(std::string_view text, const DocumentOptions& options);

struct TokenizedText {
  std::vector<uint32_t> tokens;
  int64_t documents = 0;
  int64_t max_id = -1;  // the largest id (-1: no token)
  std::string digest;   // xxh64 of the tokens' bytes: processes that tokenized alike agree on it
};
TokenizedText tokenize_text(const Tokenizer& tokenizer, std::string_view text, const DocumentOptions& options);

// The bytes of a text file. Error naming it when it is a directory or unreadable.
std::string read_text_file(const std::string& path);

// The text file `path` tokenized by the model at `model_path`, once per process: later calls with
// the same model, file (path, size, modification time) and options return the same tokens (ranks as
// threads share them). Every MPI process tokenizes for itself; the tokenization is deterministic.
std::shared_ptr<const TokenizedText> tokenize_file_cached(const std::string& model_path, const std::string& path,
                                                          const DocumentOptions& options);

// What the tokens of a run depend on besides the text: the model file's name, size and xxh64, and
// the document options ("tokenizer.model (241234 bytes, xxh64 0123456789abcdef), paragraphs, eos
// after each"), for a checkpoint's data fingerprint.
std::string tokenizer_fingerprint(const std::string& model_path, const DocumentOptions& options);

}  // namespace shardwise::train
