#include "shardwise/verify/verifier.h"

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <unordered_map>

#include "shardwise/comm/local.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/device_kernels.h"
#include "shardwise/spmd/rule.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise::verify {

using mesh::DistAttr;
using mesh::Placement;
using mesh::ProcessMesh;
using mesh::ReduceOp;
using spmd::SpmdResult;
using spmd::TensorSpec;

std::vector<ProcessMesh> default_meshes() {
  return {ProcessMesh(Shape{2}), ProcessMesh(Shape{3}), ProcessMesh(Shape{2, 2}), ProcessMesh(Shape{2, 3})};
}

namespace {

// Every placement one mesh dim can take for a tensor of rank `ndim` and this dtype. Partial sum
// and avg make no sense for bool (there is no bool addition), so they are left out for bool.
std::vector<Placement> placement_options(int ndim, DType dtype) {
  std::vector<Placement> out = {Placement::replicate()};
  for (int d = 0; d < ndim; ++d) out.push_back(Placement::shard(d));
  if (dtype != DType::Bool) {
    out.push_back(Placement::partial(ReduceOp::Sum));
    out.push_back(Placement::partial(ReduceOp::Avg));
  }
  out.push_back(Placement::partial(ReduceOp::Max));
  out.push_back(Placement::partial(ReduceOp::Min));
  return out;
}

// Mixed-radix enumeration of one placement per (tensor, mesh dim).
struct Enumerator {
  std::vector<std::vector<Placement>> options;  // per tensor
  int mesh_ndim = 0;
  int64_t total = 1;

  Enumerator(const std::vector<std::pair<int, DType>>& tensors, int mesh_ndim_) : mesh_ndim(mesh_ndim_) {
    for (auto [ndim, dtype] : tensors) {
      options.push_back(placement_options(ndim, dtype));
      for (int m = 0; m < mesh_ndim; ++m) total *= static_cast<int64_t>(options.back().size());
    }
  }
  std::vector<DistAttr> at(int64_t index) const {
    std::vector<DistAttr> dists;
    for (const auto& opts : options) {
      DistAttr d(mesh_ndim);
      for (int m = 0; m < mesh_ndim; ++m) {
        auto k = static_cast<int64_t>(opts.size());
        d.set(m, opts[static_cast<size_t>(index % k)]);
        index /= k;
      }
      dists.push_back(d);
    }
    return dists;
  }
  // The indices to check: all of them, or `cap` distinct ones spread over the range: i * step mod
  // total with step near total / golden ratio and coprime to total. (Evenly spaced indices
  // i * total / cap were a fixed stride: where cap divided total the stride held every low
  // mixed-radix digit constant, so the first tensors kept one placement in every checked case.)
  std::vector<int64_t> indices(int64_t cap) const {
    std::vector<int64_t> out;
    if (total <= cap) {
      for (int64_t i = 0; i < total; ++i) out.push_back(i);
    } else {
      auto step = static_cast<int64_t>(static_cast<long double>(total) * 0.6180339887498948482L);
      while (std::gcd(step, total) != 1) ++step;
      for (int64_t i = 0; i < cap; ++i) {
        out.push_back(static_cast<int64_t>((static_cast<__int128>(i) * step) % total));
      }
    }
    return out;
  }
};

std::pair<double, double> tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return {1e-9, 1e-9};
    case DType::F32: return {2e-4, 2e-5};
    case DType::F16: case DType::BF16: return {3e-2, 3e-2};
    default: return {0.0, 0.0};
  }
}

std::string describe(const std::vector<TensorSpec>& specs) {
  std::string out;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (i) out += "; ";
    out += fmt::format("{} {} [{}]", dtype_name(specs[i].dtype), specs[i].shape.to_string(), specs[i].dist.to_string());
  }
  return out;
}

std::string dist_list(const std::vector<DistAttr>& dists) {
  std::string out;
  for (size_t i = 0; i < dists.size(); ++i) out += (i ? "; [" : "[") + dists[i].to_string() + "]";
  return out;
}

struct LocalRun {
  std::string error;                         // set when the local kernels could not run
  std::string skipped;                       // set when the device does not compute them (the reason)
  std::vector<std::vector<Tensor>> outputs;  // per rank, on the host
};

// A check's outcome: passed (both empty), failed (error) or skipped on the device (the reason).
struct Verdict {
  std::string error, skipped;
};

// Each defined tensor copied to `device` (counted copies); the host: unchanged.
std::vector<Tensor> on_device(std::vector<Tensor> tensors, Device device) {
  if (device.is_host()) return tensors;
  for (Tensor& t : tensors) {
    if (t.defined()) t = to_device(t, device);
  }
  return tensors;
}

// Each defined device tensor copied back to the host (counted copies).
std::vector<Tensor> on_host(std::vector<Tensor> tensors) {
  for (Tensor& t : tensors) {
    if (t.defined() && t.on_device()) t = to_host(t);
  }
  return tensors;
}

std::string layout_key(const char* part, const std::vector<DistAttr>& dists) {
  std::string key = part;
  for (const DistAttr& d : dists) {
    key += '|';
    key += d.to_string();
  }
  return key;
}

class OpVerifier {
 public:
  OpVerifier(const ops::OpDef& op, const spmd::Rule& rule, const VerifyOptions& options, Report& report)
      : op_(op), rule_(rule), options_(options), report_(report) {}

  void run() {
    std::vector<ProcessMesh> meshes = options_.meshes.empty() ? default_meshes() : options_.meshes;
    for (size_t mi = 0; mi < meshes.size(); ++mi) {
      const ProcessMesh& mesh = meshes[mi];
      Coverage row;
      row.op = op_.name;
      row.mesh = mesh.to_string();
      for (size_t ci = 0; ci < op_.cases.size(); ++ci) run_case(mesh, ci, row);
      report_.rows.push_back(row);
    }
    for (const auto& [key, checks] : skips_) report_.skips.push_back({op_.name, key.first, key.second, checks});
  }

 private:
  struct CaseData {
    std::vector<Tensor> inputs, outputs, out_grads, ref_grads;
    std::vector<ops::TensorMeta> in_meta, out_meta;
    const Attrs* attrs = nullptr;
  };

  void record(Coverage& row, const ProcessMesh& mesh, const char* part, const std::vector<TensorSpec>& specs,
              std::string message) {
    ++row.failures;
    ++report_.total_failures;
    if (recorded_ >= options_.max_failures_per_op) return;
    ++recorded_;
    report_.failures.push_back({op_.name, mesh.to_string(), part, describe(specs), std::move(message)});
  }

  void skip(Coverage& row, const char* part, const std::string& reason, int64_t checks = 1) {
    row.skipped += checks;
    skips_[{part, reason}] += checks;
  }

  // On a device whose table has no kernel for the op's forward (forward and reverse checks) or
  // gradient: the reason, else "". Each such check is skipped without asking the rule.
  std::string missing_kernel(bool gradient) const {
    if (options_.device.is_host()) return {};
    const auto table = ops::device_kernels(options_.device.kind);
    if (!table) return {};  // run_forward names the missing table in every check's failure
    if (gradient ? table->backward(op_.name) != nullptr : table->forward(op_.name) != nullptr) return {};
    return fmt::format("no {} {}kernel", table->name(), gradient ? "gradient " : "");
  }

  void run_case(const ProcessMesh& mesh, size_t ci, Coverage& row) {
    const ops::VerifyCase& vc = op_.cases[ci];
    CaseData data;
    data.attrs = &vc.attrs;
    bool even_case = true;
    for (size_t i = 0; i < vc.shapes.size(); ++i) {
      DType dtype = i < vc.dtypes.size() ? vc.dtypes[i] : DType::F64;
      if (options_.f64_as_f32 && dtype == DType::F64) dtype = DType::F32;
      ops::ValueGen gen = i < vc.values.size() ? vc.values[i] : ops::ValueGen{};
      Philox rng(options_.seed, stream_id(op_.name) + ci * 131 + i);
      data.inputs.push_back(random_tensor(vc.shapes[i], dtype, gen, rng));
      data.in_meta.push_back({vc.shapes[i], dtype});
      for (int d = 0; d < vc.shapes[i].ndim(); ++d) {
        int64_t extent = vc.shapes[i][d];
        // Even: every dim splits evenly however the mesh shards it (co-sharding included).
        if (extent % mesh.size() != 0) even_case = false;
        for (int m = 0; m < mesh.ndim(); ++m) {
          if (extent % mesh.dim_size(m) != 0) row.uneven = true;
          if (extent < mesh.dim_size(m)) row.empty_shards = true;
        }
      }
    }
    if (even_case) row.even = true;
    try {
      data.out_meta = ops::infer_checked(op_, data.in_meta, vc.attrs);
      data.outputs = ops::run_forward(op_, data.inputs, vc.attrs);
    } catch (const Error& e) {
      record(row, mesh, "forward", {}, fmt::format("case {}: the single-device op failed: {}", ci, e.what()));
      return;
    }
    runs_.clear();
    verdicts_.clear();
    if (options_.forward) check_forward(mesh, data, row, ci);
    if (options_.reverse) check_reverse(mesh, data, row, ci);
    if (options_.grad && op_.has_backward()) check_grad(mesh, data, row, ci);
    row.layouts += static_cast<int64_t>(verdicts_.size());
  }

  std::vector<TensorSpec> specs_of(const std::vector<ops::TensorMeta>& metas, const std::vector<DistAttr>& dists,
                                   size_t first = 0) {
    std::vector<TensorSpec> out;
    for (size_t i = 0; i < metas.size(); ++i) out.push_back({metas[i].shape, metas[i].dtype, dists[first + i]});
    return out;
  }

  // Runs `kernel` on every rank's shards (cut from `globals` as `required` says) and compares
  // each assembled output (laid out as `claimed` says) with `expected`: the verdict (passed when
  // neither error nor skipped is set).
  template <class Kernel>
  Verdict run_sharded(const ProcessMesh& mesh, const char* part, const std::vector<Tensor>& globals,
                      const std::vector<DistAttr>& required, const std::vector<DistAttr>& claimed,
                      const std::vector<Tensor>& expected, Coverage& row, Kernel&& kernel) {
    if (required.size() != globals.size() || claimed.size() != expected.size()) {
      return {fmt::format("the rule returned {} input and {} output distributions; the op has {} and {}",
                          required.size(), claimed.size(), globals.size(), expected.size()), {}};
    }
    std::string run_key = layout_key(part, required);
    std::string verdict_key = run_key + "->" + layout_key("", claimed);
    if (auto it = verdicts_.find(verdict_key); it != verdicts_.end()) return it->second;
    std::shared_ptr<LocalRun>& run = runs_[run_key];
    if (!run) run = run_locally(mesh, globals, required, expected.size(), row, kernel);
    Verdict verdict{run->error, run->skipped};
    if (verdict.error.empty() && verdict.skipped.empty()) verdict.error = compare_outputs(mesh, *run, claimed, expected);
    verdicts_.emplace(std::move(verdict_key), verdict);
    return verdict;
  }

  // One rank's kernel on its local inputs, on the options' device: the inputs copied there and the
  // outputs back; a refusal of the device sets `skipped` (the rank's own: ranks may be threads).
  template <class Kernel>
  std::vector<Tensor> run_rank(std::string& skipped, const std::vector<Tensor>& in, const ops::KernelContext& context,
                               Kernel&& kernel) {
    if (options_.device.is_host()) return kernel(in, context);
    try {
      return on_host(kernel(on_device(in, options_.device), context));
    } catch (const ops::UnsupportedOnDevice& e) {
      skipped = e.reason();
      return {};
    }
  }

  template <class Kernel>
  std::shared_ptr<LocalRun> run_locally(const ProcessMesh& mesh, const std::vector<Tensor>& globals,
                                        const std::vector<DistAttr>& required, size_t num_outputs, Coverage& row,
                                        Kernel&& kernel) {
    auto run = std::make_shared<LocalRun>();
    auto n = static_cast<size_t>(mesh.size());
    std::vector<std::vector<Tensor>> local_in(n);
    std::vector<ops::KernelContext> contexts(n);
    try {
      for (size_t i = 0; i < globals.size(); ++i) {
        if (!globals[i].defined()) {
          for (size_t r = 0; r < n; ++r) {
            local_in[r].emplace_back();
            contexts[r].tensors.emplace_back();
          }
          continue;
        }
        required[i].validate(globals[i].ndim(), mesh.ndim(), fmt::format("required input {}", i));
        std::vector<Tensor> parts = distribute(globals[i], required[i], mesh, Philox(options_.seed, 7919 + i));
        for (size_t r = 0; r < n; ++r) {
          local_in[r].push_back(parts[r]);
          auto block = mesh::local_block(globals[i].shape(), required[i], mesh, mesh.coords(static_cast<int64_t>(r)));
          contexts[r].tensors.push_back({globals[i].shape(), block.offset, required[i]});
        }
      }
    } catch (const Error& e) {
      run->error = e.what();
      return run;
    }
    run->outputs.resize(n);
    std::vector<std::string> skipped(n);  // per rank
    if (op_.collective) {
      // Ranks run as threads so the kernels' collectives can meet.
      try {
        comm::LocalWorld::run(static_cast<int>(n), [&](comm::Communicator& world) {
          auto r = static_cast<size_t>(world.rank());
          comm::MeshComm mesh_comm(mesh, world.group(world.members()));
          contexts[r].mesh_comm = &mesh_comm;
          run->outputs[r] = run_rank(skipped[r], local_in[r], contexts[r], kernel);
          contexts[r].mesh_comm = nullptr;
        }, std::chrono::seconds(60));
      } catch (const Error& e) {
        run->error = fmt::format("the local kernels failed: {}", e.what());
        return run;
      }
    }
    for (size_t r = 0; r < n; ++r) {
      try {
        if (!op_.collective) run->outputs[r] = run_rank(skipped[r], local_in[r], contexts[r], kernel);
      } catch (const Error& e) {
        run->error = fmt::format("the local kernel failed on rank {}: {}", r, e.what());
        return run;
      }
      if (!skipped[r].empty()) {
        run->skipped = skipped[r];
        return run;
      }
      if (run->outputs[r].size() != num_outputs) {
        run->error = fmt::format("rank {} produced {} outputs, expected {}", r, run->outputs[r].size(), num_outputs);
        return run;
      }
    }
    if (!options_.device.is_host()) row.device_runs += static_cast<int64_t>(n);
    return run;
  }

  std::string compare_outputs(const ProcessMesh& mesh, const LocalRun& run, const std::vector<DistAttr>& claimed,
                              const std::vector<Tensor>& expected) {
    for (size_t o = 0; o < expected.size(); ++o) {
      if (!expected[o].defined()) continue;
      try {
        claimed[o].validate(expected[o].ndim(), mesh.ndim(), fmt::format("claimed output {}", o));
      } catch (const Error& e) {
        return e.what();
      }
      std::vector<Tensor> parts;
      for (const auto& rank_outputs : run.outputs) parts.push_back(rank_outputs[o]);
      std::string error;
      Tensor got = assemble(parts, expected[o].shape(), expected[o].dtype(), claimed[o], mesh, error);
      if (!got.defined()) return fmt::format("output {}: {}", o, error);
      auto [rtol, atol] = tolerance(expected[o].dtype());
      CompareResult cmp = compare(got, expected[o], rtol, atol);
      if (!cmp.equal) {
        return fmt::format("output {} under [{}] differs from the single-device result: {}", o, claimed[o].to_string(),
                           cmp.message);
      }
    }
    return {};
  }

  // One check; false when the device does not compute it (skipped, not counted as checked).
  bool check(const ProcessMesh& mesh, Coverage& row, const char* part, const std::vector<TensorSpec>& specs,
             const std::function<SpmdResult()>& ask, const std::vector<Tensor>& globals,
             const std::vector<Tensor>& expected,
             const std::function<std::vector<Tensor>(const std::vector<Tensor>&, const ops::KernelContext&)>& kernel) {
    SpmdResult result;
    try {
      result = ask();
    } catch (const Error& e) {
      record(row, mesh, part, specs, fmt::format("the rule threw on valid input: {}", e.what()));
      return true;
    }
    Verdict verdict;
    try {
      verdict = run_sharded(mesh, part, globals, result.inputs, result.outputs, expected, row, kernel);
    } catch (const Error& e) {
      verdict.error = e.what();
    }
    if (!verdict.skipped.empty()) {
      skip(row, part, verdict.skipped);
      return false;
    }
    if (!verdict.error.empty()) {
      record(row, mesh, part, specs, fmt::format("rule requires {} and claims {}: {}", dist_list(result.inputs),
                                                 dist_list(result.outputs), verdict.error));
    }
    return true;
  }

  void check_forward(const ProcessMesh& mesh, const CaseData& data, Coverage& row, size_t ci) {
    std::vector<std::pair<int, DType>> shape_types;
    for (const auto& m : data.in_meta) shape_types.emplace_back(m.shape.ndim(), m.dtype);
    Enumerator en(shape_types, mesh.ndim());
    auto kernel = [&](const std::vector<Tensor>& in, const ops::KernelContext& ctx) {
      return ops::run_forward(op_, in, *data.attrs, &ctx);
    };
    const std::vector<int64_t> indices = en.indices(options_.max_forward_combinations);
    if (std::string why = missing_kernel(false); !why.empty()) return skip(row, "forward", why, std::ssize(indices));
    for (int64_t idx : indices) {
      std::vector<TensorSpec> specs = specs_of(data.in_meta, en.at(idx));
      row.forward += check(mesh, row, "forward", specs, [&] { return rule_.forward(mesh, specs, *data.attrs); },
                           data.inputs, data.outputs, kernel);
    }
  }

  void check_reverse(const ProcessMesh& mesh, const CaseData& data, Coverage& row, size_t ci) {
    std::vector<std::pair<int, DType>> shape_types;
    for (const auto& m : data.out_meta) shape_types.emplace_back(m.shape.ndim(), m.dtype);
    Enumerator en(shape_types, mesh.ndim());
    std::vector<DistAttr> replicated(data.in_meta.size(), DistAttr(mesh.ndim()));
    std::vector<TensorSpec> in_specs = specs_of(data.in_meta, replicated);
    auto kernel = [&](const std::vector<Tensor>& in, const ops::KernelContext& ctx) {
      return ops::run_forward(op_, in, *data.attrs, &ctx);
    };
    const std::vector<int64_t> indices = en.indices(options_.max_combinations);
    if (std::string why = missing_kernel(false); !why.empty()) return skip(row, "reverse", why, std::ssize(indices));
    for (int64_t idx : indices) {
      std::vector<TensorSpec> out_specs = specs_of(data.out_meta, en.at(idx));
      row.reverse += check(mesh, row, "reverse", out_specs,
                           [&] { return rule_.reverse(mesh, in_specs, out_specs, *data.attrs); }, data.inputs,
                           data.outputs, kernel);
    }
  }

  void check_grad(const ProcessMesh& mesh, const CaseData& data, Coverage& row, size_t ci) {
    // Global output grads and the single-device gradient.
    std::vector<Tensor> out_grads;
    for (size_t o = 0; o < data.outputs.size(); ++o) {
      Philox rng(options_.seed ^ 0xD1B54A32D192ED03ull, stream_id(op_.name) + ci * 131 + o);
      out_grads.push_back(random_tensor(data.out_meta[o].shape, data.out_meta[o].dtype, {}, rng));
    }
    std::vector<Tensor> ref;
    try {
      ref = ops::run_backward(op_, data.inputs, data.outputs, out_grads, *data.attrs);
    } catch (const Error& e) {
      record(row, mesh, "grad", {}, fmt::format("case {}: the single-device gradient failed: {}", ci, e.what()));
      return;
    }
    size_t nin = data.inputs.size(), nout = data.outputs.size();
    // Enumerate the forward inputs' placements and the output grads' placements; the forward
    // outputs take what the forward rule gives for those inputs.
    std::vector<std::pair<int, DType>> shape_types;
    for (const auto& m : data.in_meta) shape_types.emplace_back(m.shape.ndim(), m.dtype);
    for (const auto& m : data.out_meta) shape_types.emplace_back(m.shape.ndim(), m.dtype);
    Enumerator en(shape_types, mesh.ndim());
    std::vector<Tensor> globals = data.inputs;
    globals.insert(globals.end(), data.outputs.begin(), data.outputs.end());
    globals.insert(globals.end(), out_grads.begin(), out_grads.end());
    auto kernel = [&](const std::vector<Tensor>& in, const ops::KernelContext& ctx) {
      std::span<const Tensor> all(in);
      return ops::run_backward(op_, all.subspan(0, nin), all.subspan(nin, nout), all.subspan(nin + nout, nout),
                               *data.attrs, &ctx);
    };
    const std::vector<int64_t> indices = en.indices(options_.max_combinations);
    if (std::string why = missing_kernel(true); !why.empty()) return skip(row, "grad", why, std::ssize(indices));
    for (int64_t idx : indices) {
      std::vector<DistAttr> dists = en.at(idx);
      std::vector<TensorSpec> in_specs = specs_of(data.in_meta, dists);
      std::vector<TensorSpec> specs = in_specs;
      SpmdResult fwd;
      try {
        fwd = rule_.forward(mesh, in_specs, *data.attrs);
      } catch (const Error& e) {
        record(row, mesh, "grad", in_specs, fmt::format("the forward rule threw on valid input: {}", e.what()));
        continue;
      }
      std::vector<TensorSpec> out_specs = specs_of(data.out_meta, fwd.outputs);
      std::vector<TensorSpec> grad_specs = specs_of(data.out_meta, dists, nin);
      specs.insert(specs.end(), out_specs.begin(), out_specs.end());
      specs.insert(specs.end(), grad_specs.begin(), grad_specs.end());
      row.grad += check(mesh, row, "grad", specs, [&] { return rule_.grad(mesh, specs, *data.attrs); }, globals, ref,
                        kernel);
    }
  }

  const ops::OpDef& op_;
  const spmd::Rule& rule_;
  const VerifyOptions& options_;
  Report& report_;
  int recorded_ = 0;
  // Per case and part: the local outputs for each distinct required-input layout, and the
  // verdict for each distinct (required, claimed) pair. Every combination still asks the rule;
  // each distinct answer is run and compared once.
  std::unordered_map<std::string, std::shared_ptr<LocalRun>> runs_;
  std::unordered_map<std::string, Verdict> verdicts_;
  std::map<std::pair<std::string, std::string>, int64_t> skips_;  // (part, reason) -> checks skipped
};

}  // namespace

namespace {

Report report_on(Device device) {
  Report report;
  report.device = device;
  if (!device.is_host()) {
    const auto table = ops::device_kernels(device.kind);
    report.kernels = table ? table->name() : "no";
  }
  return report;
}

}  // namespace

Report verify_op(const ops::OpDef& op, const VerifyOptions& options) {
  Report report = report_on(options.device);
  OpVerifier(op, op.rule, options, report).run();
  return report;
}

Report verify_ops(const std::vector<std::string>& names, const VerifyOptions& options) {
  Report report = report_on(options.device);
  std::vector<const ops::OpDef*> selected;
  if (names.empty()) {
    selected = ops::op_registry().all();
  } else {
    for (const auto& n : names) selected.push_back(&ops::op_registry().get(n));
  }
  for (const ops::OpDef* op : selected) {
    Report one = verify_op(*op, options);
    report.rows.insert(report.rows.end(), one.rows.begin(), one.rows.end());
    report.failures.insert(report.failures.end(), one.failures.begin(), one.failures.end());
    report.skips.insert(report.skips.end(), one.skips.begin(), one.skips.end());
    report.total_failures += one.total_failures;
  }
  return report;
}

int64_t Report::checks() const {
  int64_t n = 0;
  for (const Coverage& c : rows) n += c.forward + c.grad + c.reverse;
  return n;
}

int64_t Report::skipped() const {
  int64_t n = 0;
  for (const Coverage& c : rows) n += c.skipped;
  return n;
}

std::string Report::table() const {
  // One op column width for every registered op, so the tables of single ops line up when
  // concatenated (make test prints them one after another).
  size_t w = 14;
  for (const ops::OpDef* op : ops::op_registry().all()) w = std::max(w, op->name.size());
  for (const Coverage& c : rows) w = std::max(w, c.op.size());
  std::string out = fmt::format("{:<{}} {:<8} {:>9} {:>9} {:>9} {:>8}  {:<5} {:<6} {:<5} {:>8}\n", "op", w, "mesh",
                                "forward", "grad", "reverse", "layouts", "even", "uneven", "empty", "failures");
  int64_t f = 0, g = 0, r = 0;
  for (const Coverage& c : rows) {
    out += fmt::format("{:<{}} {:<8} {:>9} {:>9} {:>9} {:>8}  {:<5} {:<6} {:<5} {:>8}\n", c.op, w, c.mesh, c.forward,
                       c.grad, c.reverse, c.layouts, c.even ? "yes" : "no", c.uneven ? "yes" : "no",
                       c.empty_shards ? "yes" : "no", c.failures);
    f += c.forward;
    g += c.grad;
    r += c.reverse;
  }
  out += fmt::format("total: {} forward, {} grad, {} reverse placement combinations checked; {} failures", f, g, r,
                     total_failures);
  if (!device.is_host()) {
    int64_t runs = 0;
    for (const Coverage& c : rows) runs += c.device_runs;
    out += fmt::format("; on {} ({} kernels): {} checks ran on the device ({} local kernel runs), {} skipped",
                       device.to_string(), kernels, checks(), runs, skipped());
    // Why, by reason: the checks and the ops (each op's own line follows).
    std::map<std::string, std::pair<int64_t, std::set<std::string>>> why;
    for (const Skip& s : skips) {
      why[s.reason].first += s.checks;
      why[s.reason].second.insert(s.op);
    }
    std::vector<std::string> reasons;
    for (const auto& [reason, n] : why) reasons.push_back(fmt::format("{}: {} checks of {} ops", reason, n.first, n.second.size()));
    if (!reasons.empty()) out += fmt::format(" ({})", fmt::join(reasons, "; "));
  }
  out += '\n';
  for (const Skip& s : skips) {
    out += fmt::format("skipped on {}: {} {}: {} checks: {}\n", device.to_string(), s.op, s.part, s.checks, s.reason);
  }
  for (const Failure& fl : failures) {
    out += fmt::format("FAIL {} on {} ({}): inputs {}: {}\n", fl.op, fl.mesh, fl.part, fl.inputs, fl.message);
  }
  return out;
}

}  // namespace shardwise::verify
