#include "shardwise/spmd/rule.h"

#include <utility>

#include "shardwise/core/error.h"

namespace shardwise::spmd {

Rule named_rule(std::string_view name, std::string summary, NamedForwardRule forward,
                NamedReverseRule reverse, NamedForwardRule grad) {
  return Rule{
      std::string(name), std::move(summary),
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
