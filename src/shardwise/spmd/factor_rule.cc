#include "shardwise/spmd/factor_rule.h"

#include <bit>

#include "shardwise/core/error.h"

namespace shardwise::spmd {

namespace {

using Notations = std::array<std::string_view, 3 * kMaxFactorTensors>;
using Dists = std::array<const DistAttr*, 3 * kMaxFactorTensors>;

// Bit m set when mesh dim m shards a letter of any of the `n` notations.
uint32_t claimed_mesh_dims(const AxisMap& axes, const Notations& notations, size_t n) {
  uint32_t mask = 0;
  for (size_t t = 0; t < n; ++t) mask |= axes.mesh_dims_sharding(notations[t]);
  return mask;
}

// Letters of the inputs that no output carries, in the order of their first appearance.
Labels contracted_letters(const Factors& f) {
  uint32_t in = 0, out = f.replicated.letters;
  for (int i = 0; i < f.num_inputs; ++i) in |= f.inputs[static_cast<size_t>(i)].letters;
  for (int o = 0; o < f.num_outputs; ++o) out |= f.outputs[static_cast<size_t>(o)].letters;
  Labels contracted;
  if ((in & ~out) == 0) return contracted;
  for (int i = 0; i < f.num_inputs; ++i) {
    for (char c : f.inputs[static_cast<size_t>(i)].view()) {
      if (c != '1' && !(out & (1u << (c - 'a'))) && !contracted.has(c)) contracted.push(c);
    }
  }
  return contracted;
}

// dist_from_axes for one call's tensors, each distinct labelling computed once (in a grad, x, out
// and dout of an elementwise op share one).
class Layouts {
 public:
  Layouts(const AxisMap& axes, int mesh_ndim) : axes_(axes), md_(mesh_ndim) {}
  const DistAttr& of(std::string_view labels) {
    for (size_t i = 0; i < n_; ++i) {
      if (keys_[i] == labels) return values_[i];
    }
    if (n_ == keys_.size()) n_ = 0;  // more distinct labellings than slots: start over
    keys_[n_] = labels;
    values_[n_] = dist_from_axes(labels, axes_, md_);
    return values_[n_++];
  }

 private:
  const AxisMap& axes_;
  int md_;
  std::array<std::string_view, 2 * kMaxFactorTensors> keys_;
  std::array<DistAttr, 2 * kMaxFactorTensors> values_;
  size_t n_ = 0;
};

// A single input whose labels every output repeats, each dim its own letter (a unary elementwise
// op): merging it alone keeps its shards as they are, so its layout is its own without Partials.
bool passes_through(const Factors& f) {
  if (f.num_inputs != 1 || f.replicated.n != 0) return false;
  const Labels& x = f.inputs[0];
  if (std::popcount(x.letters) != x.n) return false;  // a '1' or a repeated letter
  for (int o = 0; o < f.num_outputs; ++o) {
    if (f.outputs[static_cast<size_t>(o)].view() != x.view()) return false;
  }
  return true;
}

DistAttr without_partials(const DistAttr& d) {
  DistAttr out = d;
  for (int m = 0; m < d.mesh_ndim(); ++m) {
    if (d[m].is_partial()) out.set(m, Placement::replicate());
  }
  return out;
}

DistAttr output_dist(const Factors& f, int o, const Labels& contracted, const AxisMap& axes, int md) {
  DistAttr d = dist_from_axes(f.outputs[static_cast<size_t>(o)].view(), axes, md);
  add_partial_for(d, contracted.view(), axes, f.contraction);
  return d;
}

void check_output_shapes(const FactorRule& rule, const Factors& f, std::span<const TensorSpec> tensors,
                         std::string_view what) {
  for (int o = 0; o < f.num_outputs; ++o) {
    const Shape& got = tensors[static_cast<size_t>(o)].shape;
    const Shape& want = f.output_shapes[static_cast<size_t>(o)];
    SW_CHECK(got == want, "rule '{}': {} {} has shape {} but the inputs give {}", rule.name, what, o,
             got.to_string(), want.to_string());
  }
}

SpmdResult forward(const FactorRule& rule, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                   const Attrs& attrs) {
  check_inputs(rule.name, mesh, in, static_cast<size_t>(rule.num_inputs));
  const Factors f = rule.describe(in, attrs);
  const auto n = static_cast<size_t>(f.num_inputs);
  const int md = mesh.ndim();
  SpmdResult r;
  r.inputs.reserve(n);
  r.outputs.reserve(static_cast<size_t>(f.num_outputs));
  uint32_t claimed = 0;
  if (passes_through(f)) {
    r.inputs.push_back(without_partials(in[0].dist));
    for (int o = 0; o < f.num_outputs; ++o) r.outputs.push_back(r.inputs[0]);
    for (int m = 0; m < md; ++m) claimed |= in[0].dist[m].is_shard() ? 1u << m : 0u;
  } else {
    Notations notations;
    Dists dists;
    for (size_t i = 0; i < n; ++i) notations[i] = f.inputs[i].view(), dists[i] = &in[i].dist;
    const AxisMap axes = merge_axes(std::span<const std::string_view>(notations.data(), n),
                                    std::span<const DistAttr* const>(dists.data(), n), f.replicated.view());
    claimed = claimed_mesh_dims(axes, notations, n);
    const Labels contracted = contracted_letters(f);
    Layouts layouts(axes, md);
    for (size_t i = 0; i < n; ++i) r.inputs.push_back(layouts.of(notations[i]));
    for (int o = 0; o < f.num_outputs; ++o) r.outputs.push_back(output_dist(f, o, contracted, axes, md));
  }
  std::array<Placement, kMaxFactorTensors> given;
  for (int m = 0; m < md; ++m) {
    if (claimed & (1u << m)) continue;
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      given[i] = in[i].dist[m].is_partial() ? in[i].dist[m] : Placement::replicate();
      any = any || given[i].is_partial();
    }
    if (!any) continue;
    PartialChoice c;
    rule.forward_partials(std::span<const Placement>(given.data(), n), in, attrs, c);
    for (size_t i = 0; i < n; ++i) {
      if (c.operands[i].is_partial()) r.inputs[i].set(m, c.operands[i]);
    }
    for (size_t o = 0; o < r.outputs.size(); ++o) {
      if (c.results[o].is_partial()) r.outputs[o].set(m, c.results[o]);
    }
  }
  return r;
}

SpmdResult reverse(const FactorRule& rule, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                   std::span<const TensorSpec> outs, const Attrs& attrs) {
  check_inputs(rule.name, mesh, in, static_cast<size_t>(rule.num_inputs));
  const Factors f = rule.describe(in, attrs);
  SW_CHECK(outs.size() == static_cast<size_t>(f.num_outputs), "rule '{}' has {} outputs, got {}", rule.name,
           f.num_outputs, outs.size());
  check_output_shapes(rule, f, outs, "output");
  check_inputs(rule.name, mesh, outs, outs.size());
  const auto no = static_cast<size_t>(f.num_outputs);
  Notations notations;
  Dists dists;
  for (size_t o = 0; o < no; ++o) notations[o] = f.outputs[o].view(), dists[o] = &outs[o].dist;
  AxisMap axes = merge_axes(std::span<const std::string_view>(notations.data(), no),
                            std::span<const DistAttr* const>(dists.data(), no), f.replicated.view());
  const int md = mesh.ndim();
  const Labels contracted = contracted_letters(f);
  const DistAttr& want = outs[0].dist;
  uint32_t contracted_dims = 0;
  if (contracted.n > 0) {
    for (int m = 0; m < md; ++m) {
      if (!want[m].is_partial(f.contraction)) continue;
      axes[contracted.chars[0]].push_back(m);
      contracted_dims |= 1u << m;
    }
  }
  SpmdResult r;
  for (int i = 0; i < f.num_inputs; ++i) r.inputs.push_back(dist_from_axes(f.inputs[static_cast<size_t>(i)].view(), axes, md));
  for (int o = 0; o < f.num_outputs; ++o) r.outputs.push_back(output_dist(f, o, contracted, axes, md));
  for (int m = 0; m < md; ++m) {
    if (!want[m].is_partial() || (contracted_dims & (1u << m))) continue;
    PartialChoice c;
    rule.reverse_partials(std::span<const Placement>(&want[m], 1), in, attrs, c);
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      if (c.operands[i].is_partial()) r.inputs[i].set(m, c.operands[i]);
    }
    for (size_t o = 0; o < r.outputs.size(); ++o) {
      if (c.results[o].is_partial()) r.outputs[o].set(m, c.results[o]);
    }
  }
  return r;
}

SpmdResult grad(const FactorRule& rule, const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  const auto n = static_cast<size_t>(rule.num_inputs);
  SW_CHECK(g.size() > n, "rule '{}' grad takes the inputs, outputs and output gradients, got {} tensors", rule.name,
           g.size());
  const Factors f = rule.describe(g.first(n), attrs);
  const auto no = static_cast<size_t>(f.num_outputs);
  const size_t total = n + 2 * no;
  check_inputs(rule.name, mesh, g, total);
  check_output_shapes(rule, f, g.subspan(n, no), "output");
  check_output_shapes(rule, f, g.subspan(n + no, no), "output gradient");
  Notations notations;
  Dists dists;
  size_t merged = 0;
  for (size_t k = 0; k < total; ++k) {
    const bool read = k >= n + no || (rule.grad_reads & (1u << k));
    if (!read) continue;
    notations[merged] = k < n ? f.inputs[k].view() : f.outputs[(k - n) % no].view();
    dists[merged++] = &g[k].dist;
  }
  const AxisMap axes = merge_axes(std::span<const std::string_view>(notations.data(), merged),
                                  std::span<const DistAttr* const>(dists.data(), merged), f.replicated.view());
  const uint32_t claimed = claimed_mesh_dims(axes, notations, merged);
  const int md = mesh.ndim();
  Layouts layouts(axes, md);
  SpmdResult r;
  r.inputs.reserve(total);
  r.outputs.reserve(n);
  for (size_t k = 0; k < total; ++k) {
    const bool read = k >= n + no || (rule.grad_reads & (1u << k));
    std::string_view labels = k < n ? f.inputs[k].view() : f.outputs[(k - n) % no].view();
    r.inputs.push_back(read ? layouts.of(labels) : g[k].dist);
  }
  for (size_t i = 0; i < n; ++i) {
    if (rule.no_grad & (1u << i)) {
      r.outputs.emplace_back(md);
      continue;
    }
    DistAttr d = layouts.of(f.inputs[i].view());
    for (size_t o = 0; o < no; ++o) {
      for (char c : f.outputs[o].view()) {
        if (c != '1' && !f.inputs[i].has(c)) add_partial_for(d, std::string_view(&c, 1), axes, ReduceOp::Sum);
      }
    }
    r.outputs.push_back(d);
  }
  std::array<Placement, 3 * kMaxFactorTensors> given;
  for (int m = 0; m < md; ++m) {
    if (claimed & (1u << m)) continue;
    bool any = false;
    for (size_t k = 0; k < total; ++k) {
      const bool read = k >= n + no || (rule.grad_reads & (1u << k));
      given[k] = read && g[k].dist[m].is_partial() ? g[k].dist[m] : Placement::replicate();
      any = any || given[k].is_partial();
    }
    if (!any) continue;
    PartialChoice c;
    rule.grad_partials(std::span<const Placement>(given.data(), total), g, attrs, c);
    for (size_t k = 0; k < total; ++k) {
      if (c.operands[k].is_partial()) r.inputs[k].set(m, c.operands[k]);
    }
    for (size_t i = 0; i < n; ++i) {
      if (c.results[i].is_partial() && !(rule.no_grad & (1u << i))) r.outputs[i].set(m, c.results[i]);
    }
  }
  return r;
}

}  // namespace

Labels labels_of_rank(int n) {
  static const std::array<Labels, kMaxDims + 1> table = [] {
    std::array<Labels, kMaxDims + 1> t{};
    for (int r = 0; r <= kMaxDims; ++r) {
      for (char c : axis_letters(r)) t[static_cast<size_t>(r)].push(c);
    }
    return t;
  }();
  SW_CHECK(n >= 0 && n <= kMaxDims, "cannot label {} dims (at most {})", n, kMaxDims);
  return table[static_cast<size_t>(n)];
}

bool is_linear_partial(const Placement& p) { return p.is_partial(ReduceOp::Sum) || p.is_partial(ReduceOp::Avg); }

void multilinear_forward(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                         PartialChoice& choice) {
  for (size_t k = 0; k < given.size(); ++k) {
    if (!is_linear_partial(given[k])) continue;
    choice.operands[k] = given[k];
    choice.results.fill(given[k]);
    return;
  }
}

void multilinear_reverse(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                         PartialChoice& choice) {
  if (!is_linear_partial(given[0])) return;
  choice.operands[0] = given[0];
  choice.results[0] = given[0];
}

void multilinear_grad(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                      PartialChoice& choice) {
  for (size_t k = 0; k < given.size(); ++k) {
    if (!is_linear_partial(given[k])) continue;
    choice.operands[k] = given[k];
    for (size_t i = 0; i < choice.results.size(); ++i) {
      if (i != k) choice.results[i] = given[k];
    }
    return;
  }
}

Rule derive_rule(FactorRule rule) {
  SW_CHECK(rule.describe && rule.forward_partials && rule.reverse_partials && rule.grad_partials,
           "factor rule '{}' needs a description and its three partial policies", rule.name);
  SW_CHECK(rule.num_inputs >= 1 && rule.num_inputs <= kMaxFactorTensors, "factor rule '{}': {} inputs", rule.name,
           rule.num_inputs);
  auto shared = std::make_shared<const FactorRule>(std::move(rule));
  Rule r;
  r.name = shared->name;
  r.summary = shared->summary;
  r.forward = [shared](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
    return forward(*shared, mesh, in, attrs);
  };
  r.reverse = [shared](const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                       const Attrs& attrs) { return reverse(*shared, mesh, in, out, attrs); };
  r.grad = [shared](const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
    return grad(*shared, mesh, g, attrs);
  };
  return r;
}

}  // namespace shardwise::spmd
