#include "shardwise/spmd/factor_rule.h"

#include <bit>
#include <new>
#include <type_traits>

#include "shardwise/core/error.h"

namespace shardwise::spmd {

namespace {

using Notations = std::array<std::string_view, kMaxGradTensors>;
using Dists = std::array<const DistAttr*, kMaxGradTensors>;


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
// and dout of an elementwise op share one). Slots are built on first use only: a rule call is a
// few hundred nanoseconds, so even zeroing unused slots would show.
class Layouts {
 public:
  Layouts(const AxisMap& axes, int mesh_ndim) : axes_(axes), md_(mesh_ndim) {}
  const DistAttr& of(std::string_view labels) {
    for (size_t i = 0; i < n_; ++i) {
      if (labels == std::string_view(key_[i], len_[i])) return *value(i);
    }
    const size_t i = n_ < kSlots ? n_++ : kSlots - 1;  // more labellings than slots: reuse the last
    key_[i] = labels.data(), len_[i] = labels.size();
    return *new (storage_ + i * sizeof(DistAttr)) DistAttr(dist_from_axes(labels, axes_, md_));
  }

 private:
  static_assert(std::is_trivially_destructible_v<DistAttr>);
  static constexpr size_t kSlots = kMaxFactorInputs + kMaxFactorOutputs;
  DistAttr* value(size_t i) { return std::launder(reinterpret_cast<DistAttr*>(storage_ + i * sizeof(DistAttr))); }
  const AxisMap& axes_;
  int md_;
  size_t n_ = 0;
  const char* key_[kSlots];
  size_t len_[kSlots];
  alignas(DistAttr) unsigned char storage_[kSlots * sizeof(DistAttr)];
};

// A single input whose labels every output repeats, each dim its own letter (a unary elementwise
// op): merging it alone keeps its shards as they are, so its layout is its own without Partials.
bool passes_through(const Factors& f) {
  if (f.num_inputs != 1 || f.replicated.n != 0 || f.even.n != 0) return false;
  const Labels& x = f.inputs[0];
  if (std::popcount(x.letters) != x.n) return false;  // a '1' or a repeated letter
  for (int o = 0; o < f.num_outputs; ++o) {
    if (f.outputs[static_cast<size_t>(o)].view() != x.view()) return false;
  }
  return true;
}

DistAttr output_dist(const Factors& f, int o, const Labels& contracted, const AxisMap& axes, int md) {
  DistAttr d = dist_from_axes(f.outputs[static_cast<size_t>(o)].view(), axes, md);
  add_partial_for(d, contracted.view(), axes, f.contraction);
  return d;
}

// The extent of factor `c`: its first input dim's.
int64_t factor_extent(const Factors& f, std::span<const TensorSpec> in, char c) {
  for (int i = 0; i < f.num_inputs; ++i) {
    const size_t d = f.inputs[static_cast<size_t>(i)].view().find(c);
    if (d != std::string_view::npos) return in[static_cast<size_t>(i)].shape[static_cast<int>(d)];
  }
  return 0;
}

// Keeps, in split order, the mesh dims under which every chunk of an even factor stays equal and
// non-empty (its extent divisible by the product of the kept mesh dims' sizes).
void keep_even_chunks(const Factors& f, std::span<const TensorSpec> in, const ProcessMesh& mesh, AxisMap& axes) {
  for (char c : f.even.view()) {
    const int64_t extent = factor_extent(f, in, c);
    MeshDimList& dims = axes[c];
    MeshDimList kept;
    int64_t parts = 1;
    for (int m : dims) {
      const int64_t next = parts * mesh.dim_size(m);
      if (extent > 0 && extent % next == 0) {
        kept.push_back(m);
        parts = next;
      }
    }
    dims = kept;
  }
}

// The contracted factor a wanted Partial on mesh dim m shards: the one the first input sharding a
// contracted factor on m shards there, else the first.
char contracted_on(const Factors& f, std::span<const TensorSpec> in, int m, const Labels& contracted) {
  for (int i = 0; i < f.num_inputs; ++i) {
    const Placement& p = in[static_cast<size_t>(i)].dist[m];
    if (!p.is_shard()) continue;
    const char c = f.inputs[static_cast<size_t>(i)].chars[static_cast<size_t>(p.dim)];
    if (contracted.has(c)) return c;
  }
  return contracted.chars[0];
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
    r.inputs.push_back(in[0].dist.without_partials());
    for (int o = 0; o < f.num_outputs; ++o) r.outputs.push_back(r.inputs[0]);
    for (int m = 0; m < md; ++m) claimed |= in[0].dist[m].is_shard() ? 1u << m : 0u;
  } else {
    std::array<std::string_view, kMaxFactorInputs> notations;
    std::array<const DistAttr*, kMaxFactorInputs> dists;
    for (size_t i = 0; i < n; ++i) notations[i] = f.inputs[i].view(), dists[i] = &in[i].dist;
    AxisMap axes = merge_axes(std::span<const std::string_view>(notations.data(), n),
                              std::span<const DistAttr* const>(dists.data(), n), f.replicated.view());
    keep_even_chunks(f, in, mesh, axes);
    claimed = axes.claimed_mesh_dims();
    const Labels contracted = contracted_letters(f);
    for (size_t i = 0; i < n; ++i) r.inputs.push_back(dist_from_axes(notations[i], axes, md));
    for (int o = 0; o < f.num_outputs; ++o) r.outputs.push_back(output_dist(f, o, contracted, axes, md));
  }
  std::array<Placement, kMaxFactorInputs> given;
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
  if (contracted.n > 0) {
    for (int m = 0; m < md; ++m) {
      if (want[m].is_partial(f.contraction)) axes[contracted_on(f, in, m, contracted)].push_back(m);
    }
  }
  keep_even_chunks(f, in, mesh, axes);
  SpmdResult r;
  for (int i = 0; i < f.num_inputs; ++i) r.inputs.push_back(dist_from_axes(f.inputs[static_cast<size_t>(i)].view(), axes, md));
  for (int o = 0; o < f.num_outputs; ++o) r.outputs.push_back(output_dist(f, o, contracted, axes, md));
  for (int m = 0; m < md; ++m) {
    if (!want[m].is_partial() || axes.letter_of(m) != 0) continue;
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

// What the grad part does with grad input k (inputs ++ outputs ++ output gradients).
enum class GradRole {
  Unread,  // left as given, not merged
  Layout,  // merged (its layout decides the others'), left as given
  Read,    // merged and laid out on the merged letters
  Ignored  // the gradient of an output that takes none: laid out on the merged letters, not merged
};

GradRole grad_role(const FactorRule& rule, size_t k, size_t n, size_t no) {
  if (k >= n + no) return (rule.no_grad_outputs >> (k - n - no)) & 1u ? GradRole::Ignored : GradRole::Read;
  if (rule.grad_layout_only & (1u << k)) return GradRole::Layout;
  return rule.grad_reads & (1u << k) ? GradRole::Read : GradRole::Unread;
}

// The merged letters of the grad part: the tensors it merges, in its merge order.
AxisMap grad_axes(const FactorRule& rule, const Factors& f, std::span<const TensorSpec> g) {
  const auto n = static_cast<size_t>(f.num_inputs), no = static_cast<size_t>(f.num_outputs);
  Labels replicated;  // replicated ++ grad_replicated, built only when the latter has letters
  if (f.grad_replicated.n != 0) {
    replicated = f.replicated;
    for (char c : f.grad_replicated.view()) {
      if (!replicated.has(c)) replicated.push(c);
    }
  }
  const std::string_view never = f.grad_replicated.n != 0 ? replicated.view() : f.replicated.view();
  Notations notations;
  Dists dists;
  size_t merged = 0;
  for (size_t j = 0; j < n + 2 * no; ++j) {
    size_t k = j;  // grad_gradients_first: inputs, output gradients, outputs
    if (rule.grad_gradients_first && j >= n) k = j < n + no ? j + no : j - no;
    const GradRole role = grad_role(rule, k, n, no);
    if (role != GradRole::Layout && role != GradRole::Read) continue;
    notations[merged] = k < n ? f.inputs[k].view() : f.outputs[(k - n) % no].view();
    dists[merged++] = &g[k].dist;
  }
  return merge_axes(std::span<const std::string_view>(notations.data(), merged),
                    std::span<const DistAttr* const>(dists.data(), merged), never);
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
  AxisMap axes = grad_axes(rule, f, g);
  keep_even_chunks(f, g.first(n), mesh, axes);
  const uint32_t claimed = axes.claimed_mesh_dims();
  const int md = mesh.ndim();
  Layouts layouts(axes, md);
  SpmdResult r;
  r.inputs.reserve(total);
  r.outputs.reserve(n);
  std::array<GradRole, kMaxGradTensors> roles;
  for (size_t k = 0; k < total; ++k) roles[k] = grad_role(rule, k, n, no);
  for (size_t k = 0; k < total; ++k) {
    const GradRole role = roles[k];
    std::string_view labels = k < n ? f.inputs[k].view() : f.outputs[(k - n) % no].view();
    const bool laid_out = role == GradRole::Read || role == GradRole::Ignored;
    r.inputs.push_back(laid_out ? layouts.of(labels) : g[k].dist);
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
  std::array<Placement, kMaxGradTensors> given;
  for (int m = 0; m < md; ++m) {
    if (claimed & (1u << m)) continue;
    bool any = false;
    for (size_t k = 0; k < total; ++k) {
      const bool read = roles[k] == GradRole::Read;
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
  SW_CHECK(rule.num_inputs >= 1 && rule.num_inputs <= kMaxFactorInputs, "factor rule '{}': {} inputs", rule.name,
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
