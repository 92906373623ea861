// `shardwise train --profile`: the same losses as without, bit for bit; trace.json is Chrome
// trace-event JSON with one named track per rank, complete events that nest, every op, reshard,
// collective and optimizer event inside a step; the printed table's per-type counts and times are
// the sums of the trace's events of that type. Threads (dp=2 x tp=2) and 4 MPI processes. The MoE
// exchange on both its paths.
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

// A track's events by start, the longer first where two start together (an event before those it holds).
void sort_by_start(std::vector<json>& events) {
  std::sort(events.begin(), events.end(), [](const json& a, const json& b) {
    const double ta = a["ts"], tb = b["ts"];
    return ta != tb ? ta < tb : a["dur"].get<double>() > b["dur"].get<double>();
  });
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
    sort_by_start(events);
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

// One rank (dp = 1): its gradients are P(sum) over a mesh dim of one rank, which the reshard plan
// leaves out, so no reshard makes a collective (there was one all_reduce per parameter and step,
// and one for the loss). What stays per step is the Trainer's agreement over the world, which a
// world of one still calls (2 scalars' all_reduce, a few microseconds): the gradient norm's sum and
// the loader's wait times; and the loss's broadcast from the last pipeline stage.
TEST(CliProfile, OneRankMakesNoReshardCollectives) {
  const std::string dir = tmp("shardwise-profile-dp1");
  std::system(("rm -rf " + dir).c_str());
  auto r = shardwise_cli_test::run("train --mesh dp=1 --layers 2 --hidden 32 --steps 3 --global-batch 8 --eval-every 0 "
                                   "--progress none --profile --run-dir " + dir);
  ASSERT_EQ(r.status, 0) << r.out;
  json trace = json::parse(read(dir + "/trace.json"));
  std::vector<json> events;
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") events.push_back(e);
  sort_by_start(events);
  std::map<std::string, int> collectives;  // "parent's cat: name"
  std::vector<std::pair<double, std::string>> open;  // end, cat
  int reshards = 0;
  for (const json& e : events) {
    const double ts = e["ts"];
    while (!open.empty() && ts >= open.back().first) open.pop_back();
    if (e["cat"] == "collective") ++collectives[(open.empty() ? "" : open.back().second) + ": " + e["name"].get<std::string>()];
    reshards += e["cat"] == "reshard";
    open.emplace_back(ts + e["dur"].get<double>(), e["cat"]);
  }
  EXPECT_GT(reshards, 0);  // the reshards are still there: they hand their input on
  EXPECT_EQ(collectives, (std::map<std::string, int>{{"step: all_reduce", 2 * 3}, {"step: broadcast", 3}})) << r.out;
}

// The MoE exchange on either path (SHARDWISE_MOE_EXCHANGE): each moe_mlp and moe_mlp_grad kernel
// holds two all_to_all events, the dispatch and the combine, in that order.
struct MoeExchanges {
  std::vector<std::vector<json>> per_rank;  // per rank, in order: {kernel, dispatch or combine, bytes}
  std::set<std::string> details;            // of every all_to_all event
  int64_t other_all_to_alls = 0;            // outside an moe_mlp kernel
};

MoeExchanges moe_exchanges(const std::string& path) {
  json trace = json::parse(read(path));
  std::map<int, std::vector<json>> by_track;
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") by_track[e.at("tid").get<int>()].push_back(e);
  MoeExchanges out;
  for (auto& [tid, events] : by_track) {
    sort_by_start(events);
    std::vector<std::pair<double, std::string>> open;  // end, "cat name"
    std::vector<json> mine;
    int in_kernel = 0;
    for (const json& e : events) {
      const double ts = e["ts"], end = ts + e["dur"].get<double>();
      while (!open.empty() && ts >= open.back().first) open.pop_back();
      const std::string name = e["name"], type = e["cat"].get<std::string>() + " " + name;
      if (type.rfind("op moe_mlp", 0) == 0) in_kernel = 0;
      if (type == "collective all_to_all") {
        out.details.insert(e["args"].value("detail", ""));
        EXPECT_GE(e["dur"].get<double>(), 0.0) << e;
        if (!open.empty() && open.back().second.rfind("op moe_mlp", 0) == 0) {
          // The exchange's span ends inside its kernel's (to the clock's 1 ns: ts and dur are in us).
          EXPECT_LE(end, open.back().first + 1e-3) << e << " runs past its kernel, " << open.back().second;
          mine.push_back({open.back().second.substr(3), in_kernel++ == 0 ? "dispatch" : "combine", e["args"]["bytes"]});
        } else {
          ++out.other_all_to_alls;
        }
      }
      open.emplace_back(end, type);
    }
    out.per_rank.push_back(std::move(mine));
  }
  return out;
}

// --profile records the MoE exchange through the node-shared regions (the threads backend's
// default) as it records the message exchange: an all_to_all event per dispatch and per combine,
// forward and backward, inside the moe_mlp kernels, with the same bytes on both paths (the message
// path's come from ProfiledCommunicator::all_to_all_pieces, the shared path's from the counts
// RowExchange names), and the combines' bytes are what every token's top-2 rows make: tokens x 2 x
// the row width x 4 (forward: hidden; backward: [dx | dweight], hidden + 1).
TEST(CliProfile, MoeExchangesAreRecordedAlikeOnTheSharedAndMessagePaths) {
  const std::string args = " train --model llama --layers 2 --hidden 32 --heads 4 --vocab 128 --seq 10 --digits 2 "
                           "--experts 4 --top-k 2 --global-batch 8 --eval-every 0 --mesh ep=2 --steps 2 --progress none "
                           "--profile --run-dir ";
  MoeExchanges seen[2];
  std::vector<std::string> loss[2];
  const char* paths[2] = {"messages", "shared"};
  for (int i = 0; i < 2; ++i) {
    const std::string dir = tmp(std::string("shardwise-profile-moe-") + paths[i]);
    std::system(("rm -rf " + dir).c_str());
    auto r = shardwise_cli_test::run_command(std::string("SHARDWISE_MOE_EXCHANGE=") + paths[i] + " $SHARDWISE_BIN" +
                                             args + dir);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("collective all_to_all "), std::string::npos) << r.out;
    seen[i] = moe_exchanges(dir + "/trace.json");
    loss[i] = losses(dir);
  }
  EXPECT_EQ(loss[0], loss[1]);
  // Which path ran: only the shared one names its events so.
  EXPECT_EQ(seen[0].details, std::set<std::string>{""});
  EXPECT_EQ(seen[1].details, std::set<std::string>{"shared memory"});
  EXPECT_EQ(seen[0].other_all_to_alls, 0);
  EXPECT_EQ(seen[1].other_all_to_alls, 0);
  ASSERT_EQ(seen[1].per_rank.size(), 2u);
  // 2 steps x 2 MoE layers x (forward + backward) x (dispatch + combine) on each rank, alike.
  for (const auto& rank : seen[1].per_rank) EXPECT_EQ(rank.size(), 16u);
  EXPECT_EQ(seen[0].per_rank, seen[1].per_rank);
  std::map<std::string, int64_t> bytes;  // "moe_mlp combine", ... over both ranks
  for (const auto& rank : seen[1].per_rank)
    for (const json& e : rank) bytes[e[0].get<std::string>() + " " + e[1].get<std::string>()] += e[2].get<int64_t>();
  const int64_t rows = 2 * 2 * 8 * 10 * 2;  // steps x layers x tokens x top-2 (dropless)
  EXPECT_EQ(bytes["moe_mlp combine"], rows * 32 * 4);
  EXPECT_EQ(bytes["moe_mlp_grad combine"], rows * 33 * 4);
  // The dispatches count the rows for the other rank, forward (hidden) and backward ([x | dout |
  // weight]) alike: the routing is the same.
  EXPECT_GT(bytes["moe_mlp dispatch"], 0);
  EXPECT_LT(bytes["moe_mlp dispatch"], rows * 32 * 4);
  EXPECT_EQ(bytes["moe_mlp dispatch"] / (32 * 4) * (65 * 4), bytes["moe_mlp_grad dispatch"]);
}

}  // namespace
