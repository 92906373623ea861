#include "shardwise/ops/op.h"

#include <algorithm>

#include "shardwise/core/error.h"
#include "shardwise/ops/device_kernels.h"

namespace shardwise::ops {

void OpRegistry::add(OpDef op) {
  SW_CHECK(!op.name.empty(), "an op needs a name");
  SW_CHECK(find(op.name) == nullptr, "op '{}' is registered twice", op.name);
  SW_CHECK(op.infer && (op.forward || op.forward_in_context), "op '{}' needs shape inference and a kernel", op.name);
  SW_CHECK(!op.rule.name.empty() && op.rule.forward && op.rule.reverse && op.rule.grad,
           "op '{}' needs an SPMD rule with a name and forward, reverse and grad parts", op.name);
  ops_.push_back(std::move(op));
}

const OpDef* OpRegistry::find(std::string_view name) const {
  for (const OpDef& op : ops_) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

const OpDef& OpRegistry::get(std::string_view name) const {
  if (const OpDef* op = find(name)) return *op;
  std::vector<std::string_view> names;
  for (const OpDef& op : ops_) names.push_back(op.name);
  std::sort(names.begin(), names.end());
  fail("unknown op '{}'; known ops: {}", name, fmt::join(names, ", "));
}

const spmd::Rule& OpRegistry::rule(std::string_view rule_name) const {
  std::vector<std::string_view> names;
  for (const OpDef& op : ops_) {
    if (op.rule.name == rule_name) return op.rule;
    names.push_back(op.rule.name);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  fail("unknown SPMD rule '{}'; known rules: {}", rule_name, fmt::join(names, ", "));
}

std::vector<const OpDef*> OpRegistry::all() const {
  std::vector<const OpDef*> out;
  for (const OpDef& op : ops_) out.push_back(&op);
  std::sort(out.begin(), out.end(), [](const OpDef* a, const OpDef* b) {
    return a->family != b->family ? a->family < b->family : a->name < b->name;
  });
  return out;
}

const OpRegistry& op_registry() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_builtin_ops(r);
    return r;
  }();
  return registry;
}

KernelContext KernelContext::single_device(std::span<const Tensor> tensors) {
  KernelContext ctx;
  for (const Tensor& t : tensors) ctx.tensors.push_back({t.defined() ? t.shape() : Shape{}, {}, {}});
  return ctx;
}

comm::Communicator* KernelContext::group_sharding(size_t index, uint32_t tensor_dims, std::string_view op) const {
  if (index >= tensors.size()) return nullptr;
  const mesh::DistAttr& dist = tensors[index].dist;
  std::vector<int> mesh_dims;
  for (int m = 0; m < dist.mesh_ndim(); ++m) {
    const mesh::Placement& p = dist[m];
    SW_CHECK(!p.is_partial(),
             "{}: input {} is Partial on mesh dim {} ({}); the kernel needs it Replicate or Shard there", op, index, m,
             dist.to_string());
    if (p.is_shard() && p.dim < 32 && ((tensor_dims >> p.dim) & 1u) != 0) mesh_dims.push_back(m);
  }
  if (mesh_comm == nullptr || mesh_dims.empty()) return nullptr;
  return &mesh_comm->along(mesh_dims);
}

namespace {

// A storage-only input (u16, u32, u64) is an Error naming the op and the dtype (the message is
// formatted only then: kernels run this on every call).
void check_input_computable(const OpDef& op, size_t i, DType dtype) {
  if (is_storage_only(dtype)) check_computable(dtype, fmt::format("op '{}', input {}", op.name, i));
}

void check_inputs_computable(const OpDef& op, std::span<const Tensor> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined()) check_input_computable(op, i, inputs[i].dtype());
  }
}

void check_inputs_computable(const OpDef& op, std::span<const TensorMeta> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) check_input_computable(op, i, inputs[i].dtype);
}

}  // namespace

// A tensor on a device sends the call to that device kind's kernel (device_kernels.h): never the CPU
// kernel on device memory. The host path pays one device check per input.
std::vector<Tensor> run_forward(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                                const KernelContext* context) {
  check_inputs_computable(op, inputs);
  if (const Tensor* d = first_on_device(inputs)) [[unlikely]] {
    return run_device_forward(op, d->device(), inputs, attrs, context);
  }
  if (op.forward_in_context) {
    if (context) return op.forward_in_context(inputs, attrs, *context);
    return op.forward_in_context(inputs, attrs, KernelContext::single_device(inputs));
  }
  return op.forward(inputs, attrs);
}

bool OpDef::backward_reads_value(int k, const Attrs& attrs) const {
  if (backward_reads_for) {
    const std::vector<int> reads = backward_reads_for(attrs);
    return std::ranges::find(reads, k) != reads.end();
  }
  return !backward_reads || std::find(backward_reads->begin(), backward_reads->end(), k) != backward_reads->end();
}

std::vector<Tensor> run_backward(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                 std::span<const Tensor> out_grads, const Attrs& attrs, const KernelContext* context,
                                 std::span<const bool> wanted) {
  SW_CHECK(op.has_backward(), "op '{}' has no gradient", op.name);
  check_inputs_computable(op, inputs);
  SW_CHECK(wanted.empty() || wanted.size() == inputs.size(), "op '{}': {} gradient flags for {} inputs", op.name,
           wanted.size(), inputs.size());
  const Tensor* d = first_on_device(inputs);
  if (!d) d = first_on_device(outputs);
  if (!d) d = first_on_device(out_grads);
  if (d) [[unlikely]] return run_device_backward(op, d->device(), inputs, outputs, out_grads, attrs, context, wanted);
  if (!wanted.empty() && op.backward_partial) return op.backward_partial(inputs, outputs, out_grads, attrs, wanted);
  if (op.backward_in_context) {
    if (context) return op.backward_in_context(inputs, outputs, out_grads, attrs, *context);
    std::vector<Tensor> all(inputs.begin(), inputs.end());
    all.insert(all.end(), outputs.begin(), outputs.end());
    all.insert(all.end(), out_grads.begin(), out_grads.end());
    return op.backward_in_context(inputs, outputs, out_grads, attrs, KernelContext::single_device(all));
  }
  return op.backward(inputs, outputs, out_grads, attrs);
}

std::vector<TensorMeta> infer_checked(const OpDef& op, std::span<const TensorMeta> inputs, const Attrs& attrs) {
  if (op.num_inputs < 0) {
    SW_CHECK(!inputs.empty(), "op '{}' takes at least one input", op.name);
  } else {
    SW_CHECK(static_cast<int>(inputs.size()) == op.num_inputs, "op '{}' takes {} inputs, got {}", op.name,
             op.num_inputs, inputs.size());
  }
  check_inputs_computable(op, inputs);
  std::vector<TensorMeta> outputs = op.infer(inputs, attrs);
  SW_CHECK(op.num_outputs < 0 || static_cast<int>(outputs.size()) == op.num_outputs,
           "op '{}' inferred {} outputs, but it declares {}", op.name, outputs.size(), op.num_outputs);
  return outputs;
}

}  // namespace shardwise::ops
