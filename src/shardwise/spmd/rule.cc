#include "shardwise/spmd/rule.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "shardwise/core/error.h"

namespace shardwise::spmd {

void RuleRegistry::add(Rule rule) {
  SW_CHECK(!rule.name.empty(), "a rule needs a name");
  SW_CHECK(find(rule.name) == nullptr, "rule '{}' is registered twice", rule.name);
  SW_CHECK(rule.forward && rule.reverse && rule.grad,
           "rule '{}' must define forward, reverse and grad parts", rule.name);
  rules_.push_back(std::move(rule));
}

const Rule* RuleRegistry::find(std::string_view name) const {
  for (const Rule& r : rules_) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

const Rule& RuleRegistry::get(std::string_view name) const {
  if (const Rule* r = find(name)) return *r;
  std::vector<std::string_view> names;
  for (const Rule& r : rules_) names.push_back(r.name);
  fail("unknown SPMD rule '{}'; known rules: {}", name, fmt::join(names, ", "));
}

std::vector<const Rule*> RuleRegistry::all() const {
  std::vector<const Rule*> out;
  for (const Rule& r : rules_) out.push_back(&r);
  std::sort(out.begin(), out.end(), [](const Rule* a, const Rule* b) {
    return a->family != b->family ? a->family < b->family : a->name < b->name;
  });
  return out;
}

const RuleRegistry& rules() {
  static const RuleRegistry registry = [] {
    RuleRegistry r;
    register_builtin_rules(r);
    return r;
  }();
  return registry;
}

Rule named_rule(std::string_view name, std::string family, std::string summary, NamedForwardRule forward,
                NamedReverseRule reverse, NamedForwardRule grad) {
  return Rule{
      std::string(name), std::move(family), std::move(summary),
      [name, forward](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
        return forward(name, mesh, in, attrs);
      },
      [name, reverse](const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                      const Attrs& attrs) { return reverse(name, mesh, in, out, attrs); },
      [name, grad](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
        return grad(name, mesh, in, attrs);
      }};
}

void check_inputs(std::string_view rule, const ProcessMesh& mesh, std::span<const TensorSpec> inputs,
                  size_t expected_count) {
  SW_CHECK(inputs.size() == expected_count, "rule '{}' takes {} tensors, got {}", rule, expected_count,
           inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    // Name the input only when something is wrong: no string is built on the success path.
    if (!inputs[i].dist.is_valid(inputs[i].shape.ndim(), mesh.ndim())) {
      inputs[i].dist.validate(inputs[i].shape.ndim(), mesh.ndim(), fmt::format("{} input {}", rule, i));
    }
  }
}

}  // namespace shardwise::spmd
