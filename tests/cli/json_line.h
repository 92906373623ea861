#pragma once
// The JSON object a command printed with --json (the first line of its output starting with '{'),
// and the greedy generation transformers wrote for a checkpoint of tests/golden/hf.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace shardwise_cli_test {

// The object, or {"sequences": []} with a test failure when no line starts with '{'.
inline nlohmann::json json_of(const Result& r) {
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind('{', 0) == 0) return nlohmann::json::parse(line);
  }
  ADD_FAILURE() << "no JSON line in: " << r.out;
  return nlohmann::json::object({{"sequences", nlohmann::json::array()}});
}

// <golden>/<name>_expected.json's greedy_prompt (also as --prompt-ids text) and greedy (the prompt
// and transformers' greedy continuation).
struct GoldenGreedy {
  std::vector<int64_t> prompt, greedy;
  std::string prompt_ids;
};
inline GoldenGreedy golden_greedy(const std::string& golden, const std::string& name) {
  std::ifstream f(golden + name + "_expected.json");
  const nlohmann::json want = nlohmann::json::parse(f);
  GoldenGreedy g{want["greedy_prompt"].get<std::vector<int64_t>>(), want["greedy"].get<std::vector<int64_t>>(), {}};
  for (int64_t id : g.prompt) g.prompt_ids += (g.prompt_ids.empty() ? "" : ",") + std::to_string(id);
  return g;
}

}  // namespace shardwise_cli_test
