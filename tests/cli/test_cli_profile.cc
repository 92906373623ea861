// `shardwise train --profile`: the same losses as without, bit for bit; trace.json is Chrome
// trace-event JSON with one named track per rank, complete events that nest, every op, reshard,
// collective and optimizer event inside a step; the printed table's per-type counts and times are
// the sums of the trace's events of that type. Threads (dp=2 x tp=2) and 4 MPI processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"

using shardwise_cli_test::tmp;

namespace {

using nlohmann::json;

const std::string kArgs =
    " --mesh dp=2,tp=2 --layers 2 --hidden 32 --steps 6 --global-batch 8 --lr 0.003 --warmup 2 --eval-every 3"
    " --progress none ";

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The "loss" fields of metrics.jsonl as written (text: bit for bit).
std::vector<std::string> losses(const std::string& dir) {
  std::vector<std::string> out;
  std::istringstream in(read(dir + "/metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line).at("loss").dump());
  return out;
}

struct Totals {
  int64_t count = 0;
  double ms = 0;
};

// Checks the trace's structure; returns per "cat name" (reshard: "reshard") the events' count and time.
std::map<std::string, Totals> check_trace(const std::string& path, int ranks) {
  json trace = json::parse(read(path));
  std::map<int, std::string> track_names;
  std::map<int, std::vector<json>> by_track;
  for (const json& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "M" && e.at("name") == "thread_name") track_names[e.at("tid").get<int>()] = e.at("args").at("name");
    if (ph != "X") continue;
    for (const char* field : {"name", "cat", "ts", "dur", "pid", "tid", "args"}) EXPECT_TRUE(e.contains(field)) << e;
    by_track[e.at("tid").get<int>()].push_back(e);
  }
  EXPECT_EQ(static_cast<int>(track_names.size()), ranks);
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(track_names[r], "rank " + std::to_string(r));
  EXPECT_EQ(static_cast<int>(by_track.size()), ranks);
  std::map<std::string, Totals> totals;
  for (auto& [tid, events] : by_track) {
    // Nesting: sorted by start (longer first), each event lies inside the innermost open one or
    // starts after it ends; the top level holds steps and evaluations only.
    std::sort(events.begin(), events.end(), [](const json& a, const json& b) {
      return a["ts"] != b["ts"] ? a["ts"].get<double>() < b["ts"].get<double>() : a["dur"].get<double>() > b["dur"].get<double>();
    });
    std::vector<std::pair<double, std::string>> open;  // end, cat
    int steps = 0;
    for (const json& e : events) {
      const double ts = e["ts"], end = ts + e["dur"].get<double>();
      const std::string cat = e["cat"];
      while (!open.empty() && ts >= open.back().first) open.pop_back();
      if (open.empty()) {
        EXPECT_TRUE(cat == "step" || cat == "eval") << cat << " " << e["name"] << " outside a step on track " << tid;
      } else {
        EXPECT_LE(end, open.back().first + 1e-3) << e << " overlaps its parent on track " << tid;
        EXPECT_NE(open.front().second, "eval") << "nothing is recorded inside an evaluation";
      }
      if (cat == "step") ++steps;
      open.emplace_back(end, cat);
      Totals& t = totals[cat == "reshard" || cat == "step" ? cat : cat + " " + e["name"].get<std::string>()];
      ++t.count;
      t.ms += e["dur"].get<double>() / 1e3;
    }
    EXPECT_EQ(steps, 6) << "track " << tid;
  }
  EXPECT_GT(totals["op matmul"].count, 0);
  EXPECT_GT(totals["collective all_reduce"].count, 0);
  EXPECT_EQ(totals["optimizer adamw"].count, 6 * ranks);
  return totals;
}

// The table's rows ("  op matmul   count   ms ...") agree with the trace's sums.
void check_table(const std::string& out, const std::map<std::string, Totals>& totals) {
  int rows = 0;
  for (const auto& [type, t] : totals) {
    const size_t at = out.find("  " + type + " ");
    if (at == std::string::npos || type == "step") continue;  // a small type may be folded into "(other types)"
    std::istringstream row(out.substr(at + 2 + type.size()));
    int64_t count = 0;
    double ms = 0;
    row >> count >> ms;
    EXPECT_EQ(count, t.count) << type;
    EXPECT_NEAR(ms, t.ms, 1e-3) << type;
    ++rows;
  }
  EXPECT_GE(rows, 10) << out;
  EXPECT_NE(out.find("GEMM (matmul and matmul_grad kernels):"), std::string::npos) << out;
  EXPECT_NE(out.find("page faults (all rank threads): first step"), std::string::npos) << out;
  EXPECT_NE(out.find("allocator"), std::string::npos) << out;
}

TEST(CliProfile, ThreadsSameLossesAndAConsistentTrace) {
  std::system(("rm -rf " + tmp("shardwise-profile-off") + " " + tmp("shardwise-profile-on")).c_str());
  auto off = shardwise_cli_test::run("train" + kArgs + "--run-dir " + tmp("shardwise-profile-off"));
  ASSERT_EQ(off.status, 0) << off.out;
  auto on = shardwise_cli_test::run("train" + kArgs + "--run-dir " + tmp("shardwise-profile-on") + " --profile");
  ASSERT_EQ(on.status, 0) << on.out;
  EXPECT_EQ(off.out.find("profile:"), std::string::npos);
  EXPECT_NE(on.out.find("profile: 6 steps on 4 ranks"), std::string::npos) << on.out;
  std::vector<std::string> a = losses(tmp("shardwise-profile-off")), b = losses(tmp("shardwise-profile-on"));
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  check_table(on.out, check_trace(tmp("shardwise-profile-on/trace.json"), 4));
}

// Under mpirun rank 0 gathers every process's events into the one trace.json.
TEST(CliProfile, FourMpiProcessesOneTraceWithFourTracks) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  std::system(("rm -rf " + tmp("shardwise-profile-mpi")).c_str());
  auto r = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train" + kArgs +
                                           "--run-dir " + tmp("shardwise-profile-mpi") + " --profile");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("profile: 6 steps on 4 ranks"), std::string::npos) << r.out;
  check_table(r.out, check_trace(tmp("shardwise-profile-mpi/trace.json"), 4));
}

// The trace is written last: a failure to write it is an error (exit 2) after the run's summary,
// the table and metrics.jsonl.
TEST(CliProfile, AnUnwritableTraceIsAnErrorAfterTheRunsResults) {
  std::system(("rm -rf " + tmp("shardwise-profile-bad") + " && mkdir -p " + tmp("shardwise-profile-bad/trace.json")).c_str());
  auto r = shardwise_cli_test::run("train --mesh dp=2 --layers 1 --hidden 32 --steps 2 --global-batch 4 --eval-every 0 "
                                   "--progress none --run-dir " + tmp("shardwise-profile-bad") + " --profile");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("profile: 2 steps on 2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cannot write the trace " + tmp("shardwise-profile-bad/trace.json") + ": Is a directory"), std::string::npos)
      << r.out;
  EXPECT_EQ(losses(tmp("shardwise-profile-bad")).size(), 2u);
}

}  // namespace
