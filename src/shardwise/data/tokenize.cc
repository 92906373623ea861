#include "shardwise/data/tokenize.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "shardwise/ckpt/checksum.h"
#include "shardwise/core/error.h"

namespace shardwise::train {

DocumentSplit parse_document_split(const std::string& name) {
  if (name == "file") return DocumentSplit::File;
  if (name == "lines") return DocumentSplit::Lines;
  if (name == "paragraphs") return DocumentSplit::Paragraphs;
  fail("--documents '{}' is not one of file, lines, paragraphs", name);
}

std::string document_split_name(DocumentSplit split) {
  switch (split) {
    case DocumentSplit::File: return "file";
    case DocumentSplit::Lines: return "lines";
    case DocumentSplit::Paragraphs: return "paragraphs";
  }
  return "?";
}

std::string DocumentOptions::describe() const {
  const std::string how = !separator.empty()      ? fmt::format("documents separated by '{}'", separator)
                          : split == DocumentSplit::File ? std::string("one document per file")
                                                         : fmt::format("one document per {}", split == DocumentSplit::Lines ? "line" : "paragraph");
  return how + (eos ? ", eos after each" : ", no eos");
}

namespace {

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

std::string_view strip_line_breaks(std::string_view s) {
  while (!s.empty() && (s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Lines of `text` as views without their '\n'.
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string_view> split_documents(std::string_view text, const DocumentOptions& o) {
  std::vector<std::string_view> docs;
  if (!o.separator.empty()) {
    for (size_t begin = 0; begin <= text.size();) {
      const size_t at = std::min(text.find(o.separator, begin), text.size());
      std::string_view piece = strip_line_breaks(text.substr(begin, at - begin));
      if (!piece.empty()) docs.push_back(piece);
      begin = at + o.separator.size();
    }
    return docs;
  }
  if (o.split == DocumentSplit::File) {
    if (!text.empty()) docs.push_back(text);
    return docs;
  }
  const std::vector<std::string_view> lines = lines_of(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (is_blank(lines[i])) continue;
    if (o.split == DocumentSplit::Lines) {
      std::string_view line = lines[i];
      if (line.ends_with('\r')) line.remove_suffix(1);
      docs.push_back(line);
      continue;
    }
    size_t last = i;  // a paragraph: lines [i, last] are not blank
    while (last + 1 < lines.size() && !is_blank(lines[last + 1])) ++last;
    const char* begin = lines[i].data();
    docs.push_back(std::string_view(begin, static_cast<size_t>(lines[last].data() + lines[last].size() - begin)));
    i = last;
  }
  return docs;
}

TokenizedText tokenize_text(const Tokenizer& tokenizer, std::string_view text, const DocumentOptions& o) {
  SW_CHECK(!o.eos || tokenizer.eos_id() >= 0,
           "tokenizer '{}' defines no end-of-text (eos) id to put after each document: pass "
           "--no-eos-between-documents, or use a model with one",
           tokenizer.path());
  TokenizedText out;
  for (std::string_view doc : split_documents(text, o)) {
    for (int64_t id : tokenizer.encode(doc)) out.tokens.push_back(static_cast<uint32_t>(id));
    if (o.eos) out.tokens.push_back(static_cast<uint32_t>(tokenizer.eos_id()));
    ++out.documents;
  }
  for (uint32_t t : out.tokens) out.max_id = std::max<int64_t>(out.max_id, t);
  out.digest = ckpt::xxh64_hex(std::as_bytes(std::span(out.tokens)));
  return out;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  SW_CHECK(!std::filesystem::is_directory(path, ec), "'{}' is a directory; expected a text file", path);
  std::ifstream in(path, std::ios::binary);
  SW_CHECK(in.good(), "cannot read the text file '{}'", path);
  std::ostringstream s;
  s << in.rdbuf();
  return std::move(s).str();
}

namespace {

std::string file_key(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  return fmt::format("{}\n{}\n{}", path, ec ? 0 : size, mtime);
}

}  // namespace

std::shared_ptr<const TokenizedText> tokenize_file_cached(const std::string& model_path, const std::string& path,
                                                          const DocumentOptions& o) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const TokenizedText>> cache;
  const std::string key = fmt::format("{}\n{}\n{}", file_key(model_path), file_key(path), o.describe());
  std::lock_guard lock(mutex);  // held while tokenizing: ranks as threads wait for the first one
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const Tokenizer tokenizer(model_path);
  auto tokens = std::make_shared<const TokenizedText>(tokenize_text(tokenizer, read_text_file(path), o));
  cache[key] = tokens;
  return tokens;
}

std::string tokenizer_fingerprint(const std::string& model_path, const DocumentOptions& o) {
  const ckpt::FileDigest d = ckpt::digest_file(model_path, false);
  return fmt::format("{} ({} bytes, xxh64 {}), {}", std::filesystem::path(model_path).filename().string(), d.size,
                     d.xxh64, o.describe());
}

}  // namespace shardwise::train
