#include "shardwise/plan/analytic.h"

#include <algorithm>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/plan/cost.h"

namespace shardwise::plan {

namespace {

int64_t attention_params(const ModelSize& m) {
  return m.hidden * m.head_dim * (m.heads + 2 * m.kv_heads) + m.heads * m.head_dim * m.hidden;
}
int64_t mlp_params(const ModelSize& m) { return (m.swiglu ? 3 : 2) * m.hidden * m.mlp_width; }

// The global ranks of a group: `size` members `stride` apart from rank 0 (the mesh's order: pp
// outermost, then dp, ep, tp innermost).
std::vector<int> strided(int64_t size, int64_t stride) {
  std::vector<int> r;
  for (int64_t i = 0; i < size; ++i) r.push_back(static_cast<int>(i * stride));
  return r;
}

double ring(const ClusterSpec& cl, CollectiveKind kind, double bytes, int64_t size, int64_t stride) {
  if (size <= 1) return 0;
  const std::vector<int> group = strided(size, stride);
  return collective_seconds(kind, bytes, static_cast<int>(size), group_link(cl, group));
}

// Micro-batches' layers held at once on the first pipeline rank, in units of one stage's layers.
double in_flight(const Candidate& c, int64_t micro_batches) {
  if (c.pp == 1) return 1;
  if (c.schedule == "fthenb") return static_cast<double>(micro_batches);
  const double pp = static_cast<double>(std::min(c.pp, micro_batches));
  if (c.schedule == "interleaved") return pp * (1 + (pp - 1) / (pp * c.virtual_stages));  // Narayanan et al. 2021
  return pp;
}

}  // namespace

int64_t ModelSize::params() const {
  const int64_t mlp = experts > 0 ? experts * mlp_params(*this) + hidden * experts : mlp_params(*this);
  return layers * (attention_params(*this) + mlp + 2 * hidden) + vocab * hidden * (tied ? 1 : 2);
}

namespace {

// A candidate's per-device sizes both halves of the model use.
struct Sizes {
  double e, t, b, s, h, layers, d;
  int64_t data, micro_batches;
  bool recompute;
  double layer_params, params;  // a layer's on a device; the last stage's (its layers and the head)
};

Sizes sizes(const ModelSize& m, const Candidate& c, int64_t global_batch, const std::string& dtype) {
  Sizes z;
  z.e = dtype == "bf16" ? 2 : 4, z.t = static_cast<double>(c.tp);
  z.b = static_cast<double>(c.micro_batch), z.s = static_cast<double>(m.seq), z.h = static_cast<double>(m.hidden);
  z.layers = static_cast<double>(m.layers / c.pp);
  z.data = c.dp * c.ep, z.d = static_cast<double>(z.data);
  z.micro_batches = global_batch / (z.data * c.micro_batch);
  z.recompute = c.recompute == "full";
  const double expert_share = m.experts > 0 ? static_cast<double>(m.experts) / static_cast<double>(c.ep) : 1;
  z.layer_params = (static_cast<double>(attention_params(m)) + expert_share * static_cast<double>(mlp_params(m))) / z.t + 2 * z.h;
  z.params = z.layers * z.layer_params + static_cast<double>(m.vocab) * z.h / z.t;
  return z;
}

}  // namespace

int64_t analytic_memory(const ModelSize& m, const Candidate& c, int64_t global_batch, const std::string& dtype) {
  const Sizes z = sizes(m, c, global_batch, dtype);
  const double state_share = c.sharding_stage >= 1 ? z.d : 1;
  // State, then the activations in flight (first stage) or the head's (last).
  const double state = z.e * z.params / (c.sharding_stage == 3 ? z.d : 1) +
                       4 * z.params / (c.sharding_stage >= 2 ? z.d : 1) +
                       (8 + (dtype == "bf16" ? 4 : 0)) * z.params / state_share;
  const double sbh = z.s * z.b * z.h;
  const double full_layer = sbh * (c.sequence_parallel ? 34 / z.t : 10 + 24 / z.t) * z.e / 2;
  const double kept_layer = z.recompute ? sbh * z.e / (c.sequence_parallel ? z.t : 1) : full_layer;
  const double first = in_flight(c, z.micro_batches) * z.layers * kept_layer + (z.recompute ? full_layer : 0);
  const double last = z.layers * kept_layer + (z.recompute ? full_layer : 0) + 4 * z.b * z.s * static_cast<double>(m.vocab) / z.t;
  const double gathered = c.sharding_stage == 3 ? 2 * z.e * z.layer_params : 0;  // a layer's gathered copy, prefetched
  return static_cast<int64_t>(state + std::max(first, last) + gathered);
}

StepEstimate analytic_estimate(const ClusterSpec& cl, const ModelSize& m, const Candidate& c, int64_t global_batch,
                               const std::string& dtype, PipelineTimer* timer) {
  SW_CHECK(c.dp * c.tp * c.pp * c.ep <= cl.devices(), "plan --auto: the mesh {} needs {} devices; cluster '{}' has {}",
           c.mesh(), c.dp * c.tp * c.pp * c.ep, cl.name, cl.devices());
  const Sizes z = sizes(m, c, global_batch, dtype);
  const double b = z.b, s = z.s, h = z.h, t = z.t, e = z.e, layers = z.layers, params = z.params;
  const bool recompute = z.recompute;
  const int64_t data = z.data;
  // FLOPs of one micro-batch's forward on a device.
  const double active_mlp = static_cast<double>(mlp_params(m)) * (m.experts > 0 ? static_cast<double>(m.top_k) : 1);
  const double layer_flops = (2 * b * s * (static_cast<double>(attention_params(m)) + active_mlp) +
                              4 * b * s * s * static_cast<double>(m.heads * m.head_dim)) / t;
  const double fwd_flops = layers * layer_flops + 2 * b * s * h * static_cast<double>(m.vocab) / t;
  const double bwd_flops = 2 * fwd_flops + (recompute ? layers * layer_flops : 0);
  // Collectives of one micro-batch.
  const double act = b * s * h * e;
  const double tp_one = ring(cl, CollectiveKind::AllReduce, act, c.tp, 1);
  const double tp_fwd = 2 * layers * tp_one, tp_bwd = (recompute ? 4 : 2) * layers * tp_one;
  const double ep_one = m.experts > 0 ? ring(cl, CollectiveKind::AllToAll, act * static_cast<double>(m.top_k), c.ep, c.tp) : 0;
  const double ep_fwd = 2 * layers * ep_one, ep_bwd = (recompute ? 4 : 2) * layers * ep_one;
  double stage3 = 0;  // per micro-batch
  if (c.sharding_stage == 3) {
    stage3 = 2 * ring(cl, CollectiveKind::AllGather, e * params, data, c.tp) +
             ring(cl, CollectiveKind::ReduceScatter, 4 * params, data, c.tp);
  }
  const double fwd = compute_seconds(cl, fwd_flops, dtype) + tp_fwd + ep_fwd + stage3 / 3;
  const double bwd = compute_seconds(cl, bwd_flops, dtype) + tp_bwd + ep_bwd + 2 * stage3 / 3;
  double send = 0;
  if (c.pp > 1) send = ring(cl, CollectiveKind::SendRecv, act / (c.sequence_parallel ? t : 1), 2, c.dp * c.ep * c.tp);
  PipelineTimer own;
  const PipelineTime pipe = (timer ? *timer : own)(c.schedule, static_cast<int>(c.pp), static_cast<int>(z.micro_batches),
                                                  c.virtual_stages, fwd, bwd, send);
  const double mbs = static_cast<double>(z.micro_batches);
  double grad_sync = 0;
  if (c.sharding_stage <= 1) grad_sync = ring(cl, CollectiveKind::AllReduce, 4 * params, data, c.tp);
  else if (c.sharding_stage == 2) grad_sync = ring(cl, CollectiveKind::ReduceScatter, 4 * params, data, c.tp);
  if (c.sharding_stage == 1 || c.sharding_stage == 2) grad_sync += ring(cl, CollectiveKind::AllGather, e * params, data, c.tp);
  StepEstimate r;
  r.parts["compute"] = mbs * compute_seconds(cl, fwd_flops + bwd_flops, dtype);
  r.parts["tp_all_reduce"] = mbs * (tp_fwd + tp_bwd);
  r.parts["ep_all_to_all"] = mbs * (ep_fwd + ep_bwd);
  r.parts["stage3_gather_scatter"] = mbs * stage3;
  r.parts["bubble"] = pipe.step - mbs * (fwd + bwd);
  r.parts["grad_sync"] = grad_sync;
  r.parts["optimizer"] = memory_seconds(cl, 7 * 4 * params / (c.sharding_stage >= 1 ? z.d : 1));
  r.step = pipe.step + grad_sync + r.parts["optimizer"];
  r.flops = mbs * (fwd_flops + bwd_flops);
  r.tokens_per_s = static_cast<double>(global_batch) * s / r.step;
  r.mfu = r.flops / r.step / cl.peak(dtype);
  r.memory = analytic_memory(m, c, global_batch, dtype);
  return r;
}

}  // namespace shardwise::plan
