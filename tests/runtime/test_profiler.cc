// The profiler's view of a run (runtime/profiler.h): a transformer block's forward and backward on
// dp=2 and tp=2, run once plainly and once profiled through a ProfiledCommunicator. The profiled
// run computes the same bits; its events count exactly the program's instructions (matmul
// kernels, reshards) and, inside the reshards, the collectives Program::collective_counts() lists
// (an independent count from the plans); the events nest within the step; the totals the
// profile keeps as it records agree with the event list.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "harness.h"
#include "shardwise/comm/local.h"
#include "shardwise/graph/completion.h"
#include "shardwise/runtime/profiled_comm.h"
#include "shardwise/runtime/profiler.h"
#include "transformer_block.h"

namespace shardwise {
namespace {

using runtime::EventKind;
using runtime::ProfileEvent;

struct Run {
  std::vector<std::map<std::string, Tensor>> grads;  // per rank: local gradient blocks
  std::vector<std::vector<ProfileEvent>> events;     // per rank
  std::vector<std::vector<std::string>> texts;       // per rank: the events' names
  std::vector<std::map<std::string, runtime::TypeTotal>> totals;
};

Run run_block(const graph::Graph& g, const graph::Program& p, const std::map<std::string, Tensor>& data, bool profiled) {
  const int n = static_cast<int>(p.mesh.size());
  Run out;
  out.grads.resize(static_cast<size_t>(n));
  out.events.resize(static_cast<size_t>(n));
  out.totals.resize(static_cast<size_t>(n));
  out.texts.resize(static_cast<size_t>(n));
  comm::LocalWorld::run(n, [&](comm::Communicator& world) {
    std::shared_ptr<comm::Communicator> self = world.group(world.members());
    runtime::RankProfile profile(world.rank());
    if (profiled) self = std::make_shared<runtime::ProfiledCommunicator>(self);
    runtime::Runtime rt(g, p, self);
    for (const auto& [name, t] : data) rt.set_global(name, t);
    if (profiled) profile.start(world);
    {
      runtime::ProfileScope step(profiled ? &profile : nullptr, EventKind::Step, "step 1");
      runtime::ActiveProfile active(profiled ? &profile : nullptr);
      rt.run();
    }
    auto r = static_cast<size_t>(world.rank());
    for (graph::ValueId v : g.params()) out.grads[r][g.value(v).name] = rt.local_grad(g.value(v).name).clone();
    out.events[r].assign(profile.events().begin(), profile.events().end());
    out.texts[r] = profile.texts();
    out.totals[r] = profile.totals();
  });
  return out;
}

bool contains(const ProfileEvent& outer, const ProfileEvent& inner) {
  return inner.start_ns >= outer.start_ns && inner.start_ns + inner.dur_ns <= outer.start_ns + outer.dur_ns;
}

void check_profile(const std::map<std::string, std::string>& placements, const mesh::ProcessMesh& mesh) {
  testing_support::BlockConfig cfg;
  graph::Graph g;
  testing_support::build_block(g, cfg, placements);
  graph::append_backward(g, g.get("loss"));
  graph::Program p = graph::lower(g, graph::complete(g, mesh));
  auto data = testing_support::block_data(cfg);
  Run plain = run_block(g, p, data, false);
  Run prof = run_block(g, p, data, true);

  // The instructions, counted from the program.
  std::map<std::string, int64_t> want_ops;  // "matmul", "matmul_grad", "reshard"
  for (const graph::Instr& ins : p.instrs) {
    if (ins.kind == graph::InstrKind::Reshard) ++want_ops["reshard"];
    else if (ins.kind == graph::InstrKind::Kernel) ++want_ops[g.node(ins.node).op];
    else if (ins.kind == graph::InstrKind::Backward) ++want_ops[g.node(ins.node).op + "_grad"];
  }
  ASSERT_GT(want_ops["matmul"], 0);
  std::map<std::string, int64_t> want_collectives;
  for (const auto& [kind, count] : p.collective_counts()) want_collectives[kind] = count;
  ASSERT_FALSE(want_collectives.empty()) << p.to_string(g);

  for (size_t r = 0; r < prof.events.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(plain.events[r].empty());  // nothing recorded without a profile
    for (const auto& [name, t] : plain.grads[r]) {
      EXPECT_EQ(std::memcmp(t.raw(), prof.grads[r].at(name).raw(), t.nbytes()), 0) << name << " differs when profiled";
    }
    const auto& ev = prof.events[r];
    auto name = [&](const ProfileEvent& e) { return prof.texts[r][static_cast<size_t>(e.name)]; };
    auto step = std::find_if(ev.begin(), ev.end(), [](const ProfileEvent& e) { return e.kind == EventKind::Step; });
    ASSERT_NE(step, ev.end());
    EXPECT_GE(step->minflt, 0);
    std::map<std::string, int64_t> ops, collectives;
    std::map<std::string, int64_t> ns_by_type;
    for (const ProfileEvent& e : ev) {
      if (e.kind == EventKind::Step) continue;
      EXPECT_TRUE(contains(*step, e)) << name(e) << " outside its step";
      if (e.kind == EventKind::Op || e.kind == EventKind::Reshard) ++ops[name(e)];
      ns_by_type[std::string(runtime::event_kind_name(e.kind)) + (e.kind == EventKind::Reshard ? "" : " " + name(e))] += e.dur_ns;
      if (e.kind != EventKind::Collective) continue;
      // Every collective of this program is a reshard's step: inside exactly one reshard event.
      int inside = 0;
      for (const ProfileEvent& o : ev) inside += o.kind == EventKind::Reshard && contains(o, e);
      EXPECT_EQ(inside, 1) << name(e);
      ++collectives[name(e)];
    }
    for (const auto& [name, count] : want_ops) {
      if (name == "matmul" || name == "matmul_grad" || name == "reshard") { EXPECT_EQ(ops[name], count) << name; }
    }
    EXPECT_EQ(collectives, want_collectives);
    // Totals kept while recording agree with the events' sums.
    for (const auto& [key, ns] : ns_by_type) EXPECT_EQ(prof.totals[r].at(key).ns, ns) << key;
    EXPECT_EQ(prof.totals[r].at("op matmul").count, want_ops["matmul"]);
  }
}

TEST(Profiler, DataParallelBlockEventsMatchTheProgram) {
  check_profile({{"ids", "S(0)"}, {"labels", "S(0)"}}, mesh::ProcessMesh(Shape{2}));
}

TEST(Profiler, TensorParallelBlockEventsMatchTheProgram) {
  // Megatron's column- then row-parallel projections, the vocabulary split (test_parallel_block.cc).
  std::map<std::string, std::string> p;
  for (const char* col : {"q", "k", "v", "fc1"}) {
    p[std::string(col) + ".weight"] = "S(1)";
    p[std::string(col) + ".bias"] = "S(0)";
  }
  p["attn_out.weight"] = "S(0)";
  p["fc2.weight"] = "S(0)";
  p["wte"] = "S(0)";
  check_profile(p, mesh::ProcessMesh(Shape{2}));
}

}  // namespace
}  // namespace shardwise
