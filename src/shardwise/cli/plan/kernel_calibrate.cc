#include "shardwise/cli/plan/kernel_calibrate.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "shardwise/cli/plan/predict.h"
#include "shardwise/cli/train/train_run.h"
#include "shardwise/core/error.h"
#include "shardwise/core/timing.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/plan/cost.h"
#include "shardwise/runtime/profiler.h"
#include "shardwise/train/trainer.h"

namespace shardwise::cli {

using nlohmann::json;

namespace {

// The reference runs: sizes unlike the benchmarks' (bench/predict_vs_measured.sh), one head size of
// 32 and one of 64, so a fit is not the benchmark's own measurement. Their vocabulary is 2048 (the
// random bytes use 256 of it): at 256, unlike any model's, the buffers of a step fell so in the
// allocator's cache that swiglu ran 2.5x slower than in any other run of the same shapes
// (1058 against 420 us at vocabulary 4096, 2026-11-29), and its fit made every Llama 8-22% slow.
std::vector<std::string> references(bool quick) {
  if (quick) return {"--layers 1 --hidden 32 --heads 2 --seq 16 --global-batch 2",
                     "--layers 1 --hidden 64 --heads 2 --seq 32 --global-batch 2"};
  return {"--layers 1 --hidden 96 --heads 3 --seq 96 --global-batch 2",
          "--layers 1 --hidden 192 --heads 3 --seq 192 --global-batch 4",
          "--model llama --layers 1 --hidden 96 --heads 3 --kv-heads 1 --seq 96 --global-batch 2",
          "--model llama --layers 1 --hidden 192 --heads 6 --kv-heads 2 --seq 192 --global-batch 4",
          "--model llama --layers 1 --hidden 96 --heads 3 --experts 4 --seq 96 --global-batch 2",
          "--model llama --layers 1 --hidden 192 --heads 3 --experts 4 --seq 160 --global-batch 4"};
}

// Multi-rank references (2 and 4 ranks: dp, tp, pp, ep, dp x tp) for the reshards' fit (the threads'
// collectives inside a step, where a rank waits for its peer to reach the same collective) and the
// fits of the types only they run (the vocab-parallel head); their measured steps over the model's
// are recorded as reference ratios (a diagnostic, not applied: see measure_kernels).
std::vector<std::string> multi_rank_references(bool quick) {
  if (quick) return {"--mesh dp=2 --layers 1 --hidden 32 --heads 2 --seq 16 --global-batch 4",
                     "--mesh tp=2 --layers 1 --hidden 64 --heads 2 --seq 32 --global-batch 2"};
  return {"--mesh dp=2 --layers 1 --hidden 96 --heads 2 --seq 96 --global-batch 4",
          "--mesh tp=2 --layers 1 --hidden 96 --heads 2 --seq 96 --global-batch 2",
          "--mesh dp=2 --layers 1 --hidden 192 --heads 4 --seq 192 --global-batch 8",
          "--mesh tp=2 --layers 1 --hidden 192 --heads 4 --seq 192 --global-batch 4",
          "--mesh pp=2 --layers 2 --hidden 96 --heads 2 --seq 96 --global-batch 8 --accumulation 4",
          "--mesh pp=2 --layers 2 --hidden 192 --heads 4 --seq 192 --global-batch 8 --accumulation 4",
          "--mesh ep=2 --model llama --layers 1 --hidden 96 --heads 2 --experts 4 --seq 96 --global-batch 4",
          "--mesh ep=2 --model llama --layers 1 --hidden 192 --heads 4 --experts 4 --seq 160 --global-batch 8",
          "--mesh dp=2,tp=2 --layers 1 --hidden 96 --heads 2 --seq 96 --global-batch 4",
          "--mesh dp=2,tp=2 --layers 1 --hidden 192 --heads 4 --seq 192 --global-batch 8"};
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// One reference run's measured seconds a step by instruction type (the profile's op, fill and
// reshard events of the steps after `warm`), the whole step's ("step") and the optimizer's
// ("optimizer"), each the median over the measured steps.
std::map<std::string, double> measure_run(const PreparedRun& run, int warm, int steps) {
  std::map<std::string, double> per_step;
  run_ranks(run, [&](comm::Communicator& world_ref, std::shared_ptr<comm::Communicator> world) {
    runtime::RankProfile profile(world_ref.rank());
    train::Trainer trainer(run.c, world);
    const bool report = world_ref.rank() == 0;
    profile.start(world_ref);
    for (int s = 0; s < warm + steps; ++s) {
      runtime::ProfileScope step(&profile, runtime::EventKind::Step, s < warm ? "warm" : "step");
      runtime::ActiveProfile active(&profile);
      trainer.step();
    }
    // Each type's seconds in each measured step, then their median (the machine as it is now, as
    // calibrate's other measurements take it).
    std::map<std::string, std::vector<double>> by_step;
    int step = 0;  // a step's event is recorded when it ends, after its instructions'
    for (const runtime::ProfileEvent& e : profile.events()) {
      if (e.kind == runtime::EventKind::Step) {
        if (step >= warm) by_step["step"].push_back(static_cast<double>(e.dur_ns) / 1e9);
        ++step;
        continue;
      }
      if (step < warm || step >= warm + steps) continue;
      const size_t i = static_cast<size_t>(step - warm);
      auto add = [&](const std::string& key) {
        std::vector<double>& v = by_step[key];
        v.resize(static_cast<size_t>(steps), 0.0);
        v[i] += static_cast<double>(e.dur_ns) / 1e9;
      };
      if (e.kind == runtime::EventKind::Optimizer) add("optimizer");
      if (e.kind == runtime::EventKind::Op || e.kind == runtime::EventKind::Fill || e.kind == runtime::EventKind::Reshard)
        add("instructions"), add("type " + profile.text(e.name));
    }
    // What each step spent outside its instructions and the optimizer.
    std::vector<double>& outside = by_step["outside"];
    for (size_t i = 0; i < by_step["step"].size(); ++i) {
      auto at = [&](const char* k) { const auto& v = by_step[k]; return i < v.size() ? v[i] : 0.0; };
      outside.push_back(std::max(0.0, at("step") - at("instructions") - at("optimizer")));
    }
    for (const auto& [key, v] : by_step)
      if (report && !v.empty()) per_step[key] = median_of(v);
  });
  return per_step;
}

struct Reference {
  train::TrainConfig config;
  int64_t ranks = 1;
  std::map<std::string, double> per_step;  // measured, rank 0
  plan::StepEstimate modelled;             // the model's, unfitted
  double measured(const std::string& key) const {
    auto it = per_step.find(key);
    return it == per_step.end() ? 0.0 : it->second;
  }
};

Reference run_reference(const std::string& options, const std::filesystem::path& data, int warm, int steps,
                        const plan::ClusterSpec& machine) {
  std::vector<std::string> args = words(options + " --vocab 2048 --data-format bytes --eval-every 0 --progress none "
                                                  "--warmup 0 --steps " + std::to_string(warm + steps));
  args.push_back("--data");
  args.push_back(data.string());
  std::ostringstream quiet;
  const PreparedRun run = prepare_train_run(parse_train_args(args).options, quiet);
  Reference r;
  r.config = run.c;
  r.ranks = run.ranks;
  r.per_step = measure_run(run, warm, steps);
  plan::ClusterSpec spanned = machine;  // every rank on this machine
  spanned.devices_per_node = std::max<int64_t>(spanned.devices_per_node, run.ranks);
  r.modelled = predict_program(run.c, spanned);
  return r;
}

}  // namespace

json measure_kernels(const plan::ClusterSpec& machine, bool quick) {
  // A token file of random bytes for the references (their data is not the point).
  const std::filesystem::path data =
      std::filesystem::temp_directory_path() / ("shardwise_calibrate_" + std::to_string(::getpid()) + ".bin");
  {
    std::ofstream f(data, std::ios::binary);
    std::mt19937 gen(7);
    for (int i = 0; i < (1 << 16); ++i) f.put(static_cast<char>(gen() & 0xff));
  }
  struct Guard {
    std::filesystem::path p;
    ~Guard() { std::error_code ec; std::filesystem::remove(p, ec); }
  } guard{data};
  const int warm = quick ? 1 : 2, steps = quick ? 2 : 6;
  std::map<std::string, std::vector<plan::KernelSample>> samples;
  std::vector<plan::KernelSample> step_samples;
  json refs = json::array();
  std::set<std::string> single_rank_types;
  for (const std::string& ref : references(quick)) {
    const Reference r = run_reference(ref + " --mesh dp=1 --ranks 1", data, warm, steps, machine);
    double instructions = 0;
    for (const auto& [type, n] : r.modelled.count_by_op) {
      instructions += n;
      single_rank_types.insert(type);
      if (type != "reshard") samples[type].push_back({n, r.modelled.by_op.at(type), r.measured("type " + type)});
    }
    step_samples.push_back({1, instructions, r.measured("outside")});
    refs.push_back({{"options", ref}, {"measured_step_s", r.measured("step")}, {"instructions", instructions},
                    {"outside_instructions_s", r.measured("outside")}});
  }
  std::vector<Reference> multi;
  for (const std::string& ref : multi_rank_references(quick)) {
    multi.push_back(run_reference(ref, data, warm, steps, machine));
    const Reference& r = multi.back();
    // The reshards, and the types no single-rank reference runs (the vocab-parallel head, whose
    // time holds its own all-reduces): fitted on the multi-rank references that run them.
    for (const auto& [type, n] : r.modelled.count_by_op)
      if (type == "reshard" || !single_rank_types.contains(type))
        samples[type].push_back({n, r.modelled.by_op.at(type), r.measured("type " + type)});
    refs.push_back({{"options", ref}, {"ranks", r.ranks}, {"measured_step_s", r.measured("step")}});
  }
  json kernels = json::object();
  for (const auto& [type, s] : samples) {
    const plan::KernelFit f = plan::fit_kernel(s);
    json pts = json::array();
    for (const plan::KernelSample& k : s) pts.push_back({k.count, k.modelled, k.measured});
    kernels[type] = {{"overhead_s", f.overhead_s}, {"scale", f.scale}, {"samples", pts}};
  }
  const plan::KernelFit step = plan::fit_kernel(step_samples);
  // The busy scales: on the multi-rank references with a rank on every core, each type the
  // single-rank references fitted, measured over its fit (count x overhead + scale x modelled),
  // summed over those references (plan/cluster.h busy_kernel_scales).
  std::map<std::string, std::pair<double, double>> busy;  // type -> measured, fitted
  for (const Reference& r : multi) {
    if (machine.cores <= 0 || r.ranks != machine.cores) continue;
    for (const auto& [type, n] : r.modelled.count_by_op) {
      if (type == "reshard" || !single_rank_types.contains(type) || !kernels.contains(type)) continue;
      busy[type].first += r.measured("type " + type);
      busy[type].second += n * kernels[type]["overhead_s"].get<double>() +
                           kernels[type]["scale"].get<double>() * r.modelled.by_op.at(type);
    }
  }
  json busy_scales = json::object();
  for (const auto& [type, mf] : busy)
    if (mf.first > 0 && mf.second > 0) busy_scales[type] = mf.first / mf.second;
  // The reference ratios: each multi-rank reference's measured step over the model's with the fits
  // and busy scales, the median by ranks and by mesh. Recorded, not applied: scaling predictions by them (as rank and
  // mesh factors, before 2026-11-29) reordered the validated configurations (Spearman 0.73-0.83
  // against 0.86-0.91 without; BENCHMARKS.md): ratios of one-layer references do not carry over to
  // other sizes. A cluster file may still set calibration.rank_factors / mesh_factors by hand.
  plan::ClusterSpec fitted = machine;
  for (auto it = kernels.begin(); it != kernels.end(); ++it)
    fitted.kernel_fits[it.key()] = {it.value()["overhead_s"].get<double>(), it.value()["scale"].get<double>()};
  fitted.step_overhead_s = step.overhead_s, fitted.instruction_gap_s = step.scale;
  for (auto it = busy_scales.begin(); it != busy_scales.end(); ++it) fitted.busy_kernel_scales[it.key()] = it.value();
  std::map<std::string, std::vector<double>> by_ranks, by_mesh;
  for (const Reference& r : multi) {
    fitted.devices_per_node = std::max<int64_t>(fitted.devices_per_node, r.ranks);
    const double ratio = r.measured("step") / predict_program(r.config, fitted).step;
    by_ranks[std::to_string(r.ranks)].push_back(ratio);
    by_mesh[mesh::parse_mesh(r.config.parallel.mesh).to_string()].push_back(ratio);
  }
  json ratios_by_ranks = json::object(), ratios_by_mesh = json::object();
  for (const auto& [ranks, v] : by_ranks) ratios_by_ranks[ranks] = median_of(v);
  for (const auto& [m, v] : by_mesh) ratios_by_mesh[m] = median_of(v);
  return {{"references", refs},
          {"kernels", kernels},
          {"step_overhead_s", step.overhead_s},
          {"instruction_gap_s", step.scale},
          {"busy_kernel_scales", busy_scales},
          {"reference_ratios", {{"by_ranks", ratios_by_ranks}, {"by_mesh", ratios_by_mesh}}}};
}

}  // namespace shardwise::cli
