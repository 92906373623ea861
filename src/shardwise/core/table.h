#pragma once
// Columns of text aligned by their widest cell, for the tables the commands print (`ckpt inspect`,
// the `--profile` table, `gemm-check`): each column as wide as its widest cell, left- or
// right-aligned, two spaces between columns, no spaces after a row's last cell.
#include <string>
#include <vector>

namespace shardwise {

class TextTable {
 public:
  enum class Align { Left, Right };
  // One alignment per column; `indent` starts every row (and every line).
  explicit TextTable(std::vector<Align> columns, std::string indent = "");
  // A row of at most one cell per column (missing cells are empty).
  void row(std::vector<std::string> cells);
  // A line printed as it is, between the rows, that does not widen any column.
  void line(std::string text);
  // Every row and line, each ending in "\n".
  std::string str() const;

 private:
  std::vector<Align> columns_;
  std::string indent_;
  struct Entry {
    std::vector<std::string> cells;
    std::string text;
    bool is_row = false;
  };
  std::vector<Entry> entries_;
};

}  // namespace shardwise
