#pragma once
// Shared by the checkpoint tests: a scratch directory, a small model's global tensors (uneven
// shapes, several dtypes, a scalar, a zero-size tensor) and the layouts of five topologies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/mesh/shard_math.h"

namespace shardwise::ckpt::testing {

struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& tag) {
    static int counter = 0;
    path = fs::temp_directory_path() / fmt::format("sw_ckpt_{}_{}_{}", tag, ::getpid(), counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct GlobalTensor {
  std::string group, name;
  Tensor value;
};

// Values are a closed formula of (tensor seed, flat index), exact in every dtype used.
inline Tensor make_global(DType dtype, const Shape& shape, int seed) {
  Tensor t(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = dtype == DType::Bool ? static_cast<double>((i * 7 + seed) % 3 == 0)
                                    : static_cast<double>(((i * 37 + seed * 11) % 201) - 100) / 8.0;
    if (dtype == DType::I32 || dtype == DType::I64) v = static_cast<double>(i * 1000003 % 99991 - seed);
    t.set_at(i, v);
  }
  return t;
}

inline std::vector<GlobalTensor> small_model() {
  std::vector<GlobalTensor> g;
  int seed = 1;
  auto add = [&](const std::string& group, const std::string& name, DType d, Shape s) {
    g.push_back({group, name, make_global(d, s, seed++)});
  };
  add("model", "embed.weight", DType::BF16, Shape{13, 6});
  add("model", "fc1.weight", DType::F32, Shape{10, 7});
  add("model", "fc1.bias", DType::F32, Shape{10});
  add("model", "fc2.weight", DType::F32, Shape{7, 10});
  add("model", "norm.weight", DType::F16, Shape{7});
  add("model", "mask", DType::Bool, Shape{5});
  add("model", "positions", DType::I32, Shape{9});
  add("model", "empty", DType::F32, Shape{0, 4});
  add("optimizer", "fc1.weight/exp_avg", DType::F32, Shape{10, 7});
  add("optimizer", "fc1.weight/exp_avg_sq", DType::F32, Shape{10, 7});
  add("optimizer", "fc2.weight/exp_avg", DType::F32, Shape{7, 10});
  add("optimizer", "step", DType::I64, Shape{});
  add("master_weights", "embed.weight", DType::F32, Shape{13, 6});
  return g;
}

// A topology: a mesh and a placement string per tensor (by name, "*" for the rest).
struct Topology {
  std::string label;
  std::string mesh;
  std::map<std::string, std::string> dist;
};

inline std::vector<Topology> topologies() {
  return {
      {"single", "1", {{"*", "R"}}},
      {"dp2", "dp=2", {{"*", "R"}, {"fc1.weight/exp_avg", "S(0)"}, {"fc1.weight/exp_avg_sq", "S(1)"}, {"fc2.weight/exp_avg", "S(0)"}}},
      {"tp2", "tp=2", {{"*", "R"}, {"fc1.weight", "S(0)"}, {"fc1.bias", "S(0)"}, {"fc2.weight", "S(1)"}, {"embed.weight", "S(0)"},
                       {"fc1.weight/exp_avg", "S(0)"}, {"fc1.weight/exp_avg_sq", "S(0)"}, {"fc2.weight/exp_avg", "S(1)"}}},
      {"dp2tp2", "dp=2,tp=2", {{"*", "R,R"}, {"fc1.weight", "R,S(0)"}, {"fc1.bias", "R,S(0)"}, {"fc2.weight", "R,S(1)"},
                               {"embed.weight", "R,S(0)"}, {"positions", "S(0),R"}, {"fc1.weight/exp_avg", "S(0),S(0)"},
                               {"fc1.weight/exp_avg_sq", "S(1),S(0)"}, {"fc2.weight/exp_avg", "S(0),S(1)"}, {"empty", "S(0),S(1)"}}},
      {"tp4", "tp=4", {{"*", "R"}, {"fc1.weight", "S(0)"}, {"fc1.bias", "S(0)"}, {"fc2.weight", "S(1)"}, {"embed.weight", "S(1)"},
                       {"norm.weight", "S(0)"}, {"fc1.weight/exp_avg", "S(0)"}, {"fc1.weight/exp_avg_sq", "S(1)"},
                       {"fc2.weight/exp_avg", "S(1)"}, {"mask", "S(0)"}}},
  };
}

inline reshard::Layout layout_of(const Topology& topo, const std::string& name) {
  mesh::ProcessMesh m = mesh::parse_mesh(topo.mesh);
  auto it = topo.dist.find(name);
  const std::string& d = it != topo.dist.end() ? it->second : topo.dist.at("*");
  return {m, mesh::parse_dist(d, m.ndim())};
}

inline std::vector<int64_t> coords_of(const reshard::Layout& l, int64_t process) {
  return l.mesh.coords(l.mesh.rank_index_of_process(process));
}

inline Tensor block_of(const Tensor& global, const reshard::Layout& l, int64_t process) {
  mesh::LocalBlock b = mesh::local_block(global.shape(), l.dist, l.mesh, coords_of(l, process));
  return global.slice(b.offsets(), b.shape);
}

// What `rank` passes to save_checkpoint under `topo`.
inline CheckpointContent content_for(const std::vector<GlobalTensor>& model, const Topology& topo, int rank, int64_t step) {
  CheckpointContent c;
  c.step = step;
  for (const auto& t : model) {
    auto it = std::find_if(c.groups.begin(), c.groups.end(), [&](const TensorGroup& g) { return g.name == t.group; });
    if (it == c.groups.end()) {
      c.groups.push_back({t.group, {}, {}});
      it = c.groups.end() - 1;
    }
    reshard::Layout l = layout_of(topo, t.name);
    it->tensors.push_back({t.name, t.value.shape(), t.value.dtype(), l, block_of(t.value, l, rank)});
  }
  c.json_files = {{"config.json", {{"hidden_size", 7}, {"model_type", "mlp"}}},
                  {"trainer_state.json", {{"step", step}, {"consumed_samples", step * 8}}}};
  return c;
}

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// Called last in a test whose O_DIRECT checks ran only where `where` takes O_DIRECT: the test shows
// as skipped, naming why, rather than passing without them (the checks before it still count).
inline void skip_unless_direct_io(bool direct_ok, const fs::path& where) {
  if (!direct_ok) {
    GTEST_SKIP() << "O_DIRECT is refused under " << where << ": its checks did not run (the other checks did); run "
                 << "with TMPDIR on a file system that takes O_DIRECT (ext4, xfs, tmpfs since Linux 6.6)";
  }
}

}  // namespace shardwise::ckpt::testing
