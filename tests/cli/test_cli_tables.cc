// The tables the commands print line up: in `ckpt inspect`, the `--profile` table and `gemm-check`,
// every row's left-aligned columns start, and its right-aligned columns end, at the same offsets,
// however long a tensor name, an event type or a library's description is.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::run_command;
using shardwise_cli_test::tmp;

// The cells of a row: the runs of text between two or more spaces, with where each starts and ends.
struct Cell {
  size_t begin, end;
};
std::vector<Cell> cells_of(const std::string& row) {
  std::vector<Cell> out;
  size_t at = row.find_first_not_of(' ');
  while (at != std::string::npos) {
    size_t end = row.find("  ", at);
    if (end == std::string::npos) end = row.size();
    out.push_back({at, end});
    at = row.find_first_not_of(' ', end);
  }
  return out;
}

// "" when every row has its columns where the first row has them ('L': the same start, 'R': the
// same end; a row may lack trailing cells), else the first row that does not.
std::string misaligned(const std::vector<std::string>& rows, const std::string& align) {
  if (rows.size() < 2) return "fewer than 2 rows";
  const std::vector<Cell> first = cells_of(rows[0]);
  if (first.size() != align.size()) return "the first row has another number of cells: " + rows[0];
  for (const std::string& row : rows) {
    const std::vector<Cell> c = cells_of(row);
    if (c.size() > align.size()) return row;
    for (size_t k = 0; k < c.size(); ++k) {
      if (align[k] == 'L' ? c[k].begin != first[k].begin : c[k].end != first[k].end) return row;
    }
  }
  return "";
}

// The lines of `text` from the first that starts with `from` up to (not including) the first after
// it for which `stop` holds.
template <class Stop>
std::vector<std::string> rows_between(const std::string& text, const std::string& from, Stop stop) {
  std::istringstream in(text);
  std::vector<std::string> out;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (inside && stop(line)) break;
    if (inside) out.push_back(line);
    if (!inside && line.starts_with(from)) inside = true, out.push_back(line);
  }
  return out;
}

TEST(CliTables, InspectProfileAndGemmCheckAlignTheirColumns) {
  const std::string dir = tmp("tables_mixtral");
  // A Mixtral checkpoint: its expert names are longer than the old fixed 40-character name column,
  // and the profile lists a type name longer than its old 34 characters.
  Result r = run("train --model llama --experts 2 --layers 2 --hidden 32 --heads 2 --steps 1 --global-batch 4 "
                 "--eval-every 0 --save-every 1 --progress none --profile --run-dir " + dir);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto profile = rows_between(r.out, "  type (all ranks)", [](const std::string& l) { return l.starts_with("  ("); });
  EXPECT_EQ(misaligned(profile, "LRRRRL"), "") << r.out;
  EXPECT_NE(r.out.find("op vocab_parallel_lm_head_cross_entropy"), std::string::npos) << r.out;

  Result inspect = run("ckpt inspect " + dir + "/checkpoints/checkpoint-1");
  ASSERT_EQ(inspect.status, 0) << inspect.out;
  auto tensors = rows_between(inspect.out, "  model.embed_tokens.weight",
                              [](const std::string& l) { return !l.starts_with("  "); });
  std::erase_if(tensors, [](const std::string& l) { return l.starts_with("    "); });  // a fused tensor's parts
  EXPECT_GT(tensors.size(), 20u) << inspect.out;
  EXPECT_EQ(misaligned(tensors, "LLLRL"), "") << inspect.out;

  const char* bin = std::getenv("SHARDWISE_BIN");
  Result gemm = run_command("env -u SHARDWISE_GEMM -u OPENBLAS_CORETYPE " + std::string(bin ? bin : "shardwise") +
                            " gemm-check --quick --candidates openblas,openblas-haswell,blis");
  const auto backends = rows_between(gemm.out, "backend", [](const std::string& l) { return l.starts_with("quick"); });
  EXPECT_EQ(backends.size(), 4u) << gemm.out;
  EXPECT_EQ(misaligned(backends, "LLRRL"), "") << gemm.out;
}

}  // namespace
