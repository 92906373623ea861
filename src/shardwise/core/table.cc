#include "shardwise/core/table.h"

#include <algorithm>
#include <utility>

#include "shardwise/core/error.h"

namespace shardwise {

TextTable::TextTable(std::vector<Align> columns, std::string indent)
    : columns_(std::move(columns)), indent_(std::move(indent)) {}

void TextTable::row(std::vector<std::string> cells) {
  SW_CHECK(cells.size() <= columns_.size(), "table: a row of {} cells for {} columns", cells.size(), columns_.size());
  cells.resize(columns_.size());
  entries_.push_back({std::move(cells), "", true});
}

void TextTable::line(std::string text) { entries_.push_back({{}, std::move(text), false}); }

std::string TextTable::str() const {
  std::vector<size_t> width(columns_.size(), 0);
  for (const Entry& e : entries_) {
    for (size_t c = 0; c < e.cells.size(); ++c) width[c] = std::max(width[c], e.cells[c].size());
  }
  std::string out;
  for (const Entry& e : entries_) {
    if (!e.is_row) {
      out += indent_ + e.text + "\n";
      continue;
    }
    std::string line = indent_;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string pad(width[c] - e.cells[c].size(), ' ');
      if (c > 0) line += "  ";
      line += columns_[c] == Align::Right ? pad + e.cells[c] : e.cells[c] + pad;
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  return out;
}

}  // namespace shardwise
