// `shardwise train` on token files: llm.c's format, --data-format, several files as one corpus; the
// loader's blocked time in metrics.jsonl and the summary, with and without --no-prefetch.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;

void put_le(std::ofstream& out, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.put(static_cast<char>(v >> (8 * i) & 0xFF));
}

// An llm.c token file (version 1: uint16 tokens) of `n` tokens below `vocab` (files of different
// `seed`s hold different tokens).
void write_llmc(const fs::path& p, uint32_t n, uint32_t vocab, uint32_t seed = 0) {
  std::ofstream out(p, std::ios::binary);
  put_le(out, 20240520, 4), put_le(out, 1, 4), put_le(out, n, 4);
  for (int i = 3; i < 256; ++i) put_le(out, 0, 4);
  for (uint32_t i = 0; i < n; ++i) put_le(out, (i * 37 + i / 7 + seed * 101) % vocab, 2);
}

// The loss of every step metrics.jsonl logs, by step.
std::map<int, double> logged_losses(const fs::path& metrics) {
  std::map<int, double> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out[j.at("step").get<int>()] = j.at("loss").get<double>();
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sw_cli_data_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string train(int steps) {
  return "train --layers 1 --hidden 32 --global-batch 4 --eval-every 0 --seq 16 --vocab 300 --steps " +
         std::to_string(steps) + " ";
}
const std::string kTrain = train(2);

TEST(CliData, TrainsOnAnLlmcFile) {
  fs::path d = fresh_dir("llmc");
  write_llmc(d / "train.bin", 2000, 300);
  Result r = run(kTrain + "--run-dir " + (d / "run").string() + " --data " + (d / "train.bin").string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("llmc"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("needs a vocabulary"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(CliData, MetricsCarryTheLoaderWaitWithAndWithoutPrefetch) {
  fs::path d = fresh_dir("loader");
  write_llmc(d / "train.bin", 2000, 300);
  for (const std::string flag : {"", "--no-prefetch "}) {
    fs::remove_all(d / "run");
    Result r = run(kTrain + flag + "--run-dir " + (d / "run").string() + " --data " + (d / "train.bin").string());
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(flag.empty() ? "ms waiting for the read; prefetch)" : "ms waiting for the read; no prefetch)"),
              std::string::npos)
        << r.out;
    std::ifstream metrics(d / "run" / "metrics.jsonl");
    std::string line;
    int steps = 0;
    while (std::getline(metrics, line)) {
      ++steps;
      EXPECT_NE(line.find("\"loader_wait_s\":"), std::string::npos) << line;
      EXPECT_NE(line.find("\"loader_read_s\":"), std::string::npos) << line;
    }
    EXPECT_EQ(steps, 2);
  }
  fs::remove_all(d);
}

TEST(CliData, TrainsOnAGlobAndRefusesABadFormat) {
  fs::path d = fresh_dir("glob");
  for (int k = 0; k < 3; ++k) write_llmc(d / ("shard_" + std::to_string(k) + ".bin"), 500, 300);
  Result r = run(kTrain + "--run-dir " + (d / "run").string() + " --data '" + (d / "shard_*.bin").string() + "'");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("in 3 files"), std::string::npos) << r.out;
  Result bad = run(kTrain + "--run-dir " + (d / "run2").string() + " --data-format u8 --data " + (d / "shard_0.bin").string());
  EXPECT_NE(bad.status, 0) << bad.out;
  fs::remove_all(d);
}

// The resumed run reads the samples the uninterrupted one reads after step 2 (its steps 3 and 4
// have the same losses; the shards hold different tokens, so another shard or position would show).
TEST(CliData, AGlobResumesOnTheSameShardsAndNotOnOthers) {
  fs::path d = fresh_dir("resume");
  for (uint32_t k = 0; k < 3; ++k) write_llmc(d / ("shard_" + std::to_string(k) + ".bin"), 500, 300, k);
  const std::string run_dir = " --run-dir " + (d / "run").string() + " --save-every 2";
  const std::string glob = " --data '" + (d / "shard_*.bin").string() + "'";
  ASSERT_EQ(run(train(4) + " --run-dir " + (d / "whole").string() + glob).status, 0);
  ASSERT_EQ(run(kTrain + run_dir + glob).status, 0);
  Result again = run(train(4) + run_dir + glob + " --resume auto");
  EXPECT_EQ(again.status, 0) << again.out;
  const std::map<int, double> whole = logged_losses(d / "whole" / "metrics.jsonl"),
                              resumed = logged_losses(d / "run" / "metrics.jsonl");
  ASSERT_EQ(whole.size(), 4u);
  for (int step : {3, 4}) {
    ASSERT_TRUE(resumed.count(step)) << "step " << step << " not logged";
    EXPECT_EQ(resumed.at(step), whole.at(step)) << "step " << step;
  }
  write_llmc(d / "shard_3.bin", 500, 300, 3);  // another shard: another corpus
  Result other = run(train(6) + run_dir + glob + " --resume auto");
  EXPECT_NE(other.status, 0) << other.out;
  EXPECT_NE(other.out.find("resume with the same --data"), std::string::npos) << other.out;
  fs::remove_all(d);
}

}  // namespace
