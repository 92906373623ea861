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
// outermost, then dp, ep, cp, tp innermost).
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
  // Narayanan et al. 2021: the warm-up's 2 (p - 1) + (v - 1) p + 1 chunks of 1/v stage; at most
  // every micro-batch (Llama 3's 16 micro-batches on 16 ranks x 4 chunks: all 64 chunks, not 79).
  if (c.schedule == "interleaved")
    return std::min(static_cast<double>(micro_batches), pp * (1 + (pp - 1) / (pp * c.virtual_stages)));
  return pp;
}

}  // namespace

double AnalyticTimer::step(const std::string& schedule, int stages, int micro_batches, int virtual_stages,
                           double forward, double backward, double send) {
  const auto key = std::make_tuple(schedule, stages, micro_batches, virtual_stages, forward, backward, send);
  auto it = steps.find(key);
  if (it == steps.end())
    it = steps.emplace(key, schedules(schedule, stages, micro_batches, virtual_stages, forward, backward, send).step).first;
  return it->second;
}

std::string gemm_dtype(const ModelSize& m, const std::string& dtype) { return gemm_rate_dtype(m.bf16_compute, dtype); }

int64_t ModelSize::params() const {
  const int64_t mlp = experts > 0 ? experts * mlp_params(*this) + hidden * experts : mlp_params(*this);
  return layers * (attention_params(*this) + mlp + 2 * hidden) + vocab * hidden * (tied ? 1 : 2);
}

namespace {

// A candidate's per-device sizes both halves of the model use.
struct Sizes {
  double e, t, b, s, h, layers, cp;  // s: the tokens of a sequence on a device (seq / cp); layers: a rank's
  int64_t data, grads, micro_batches;  // data: ranks splitting the batch (dp x ep); grads: dp x ep x cp
  bool recompute;
  double layer_params, params;  // a layer's on a device; the last stage's (its layers and the head)
};

Sizes sizes(const ModelSize& m, const Candidate& c, int64_t global_batch, const std::string& dtype) {
  Sizes z;
  z.e = dtype == "bf16" ? 2 : 4, z.t = static_cast<double>(c.tp), z.cp = static_cast<double>(c.cp);
  z.b = static_cast<double>(c.micro_batch), z.h = static_cast<double>(m.hidden);
  z.s = static_cast<double>(m.seq) / z.cp;
  const int64_t chunks = c.pp * c.virtual_stages;
  z.layers = static_cast<double>((m.layers + chunks - 1) / chunks * c.virtual_stages);
  z.data = c.dp * c.ep, z.grads = z.data * c.cp;
  z.micro_batches = global_batch / (z.data * c.micro_batch);
  z.recompute = c.recompute == "full";
  const double expert_share = m.experts > 0 ? static_cast<double>(m.experts) / static_cast<double>(c.ep) : 1;
  z.layer_params = (static_cast<double>(attention_params(m)) + expert_share * static_cast<double>(mlp_params(m))) / z.t + 2 * z.h;
  z.params = z.layers * z.layer_params + static_cast<double>(m.vocab) * z.h / z.t;
  return z;
}

// A layer's activation bytes on a device (K eq. 2 / 5 at 2 bytes, scaled to `bytes` an element:
// the dtype's for the memory-bound traffic, kActivationBytes for the memory; analytic.h).
double layer_activations(const ModelSize& m, const Candidate& c, const Sizes& z, double bytes) {
  const double sbh = z.s * z.b * z.h, split = 8 + (m.swiglu ? 8 : 4) * static_cast<double>(m.mlp_width) / z.h;
  const double per_sbh = c.sequence_parallel ? (10 + split) / z.t : 10 + split / z.t;
  const double scores = m.fused_attention ? 0 : 5 * static_cast<double>(m.heads) * z.s * static_cast<double>(m.seq) * z.b / z.t;
  return (sbh * per_sbh + scores) * bytes / 2;
}

// A layer's bytes a frame keeps under bf16 compute, tensor by tensor as the runtime keeps them
// (the compiled programs' memory plan; tests/plan/test_analytic_bf16.cc), in units of the
// device's tokens x hidden (sbh): Llama (SwiGLU, RMSNorm) keeps q, the attention's output and the
// output projection's input in bf16 (6 a d / h, over t), k and v in bf16 (4 kv d / h), the MLP's
// gate and up in f32 and their product in bf16 (10 f / h), the layer input and the attention
// residual in f32 (8) and both norms' f32 outputs (8: RMSNorm's gradient reads them); GPT-2
// (LayerNorm, GELU) q, k, v, the output and the projection's input in bf16 (10 a d / h), the
// first MLP matmul's f32 output and the GELU's bf16 output (6 f / h), the stream (8) and both norms'
// outputs in bf16 only (4: LayerNorm's gradient reads its input). Without sequence parallelism the
// stream and the norms' outputs are whole on tp, and Llama keeps the norms' bf16 copies whole too
// (4); with it every tensor is split over tp and the gathered matmul inputs are gathered again in
// the backward. The unfused core's scores at kActivationBytes, as under f32 compute.
double bf16_compute_activations(const ModelSize& m, const Candidate& c, const Sizes& z) {
  const double sbh = z.s * z.b * z.h, h = z.h, f = static_cast<double>(m.mlp_width);
  const double ad = static_cast<double>(m.heads * m.head_dim), kvd = static_cast<double>(m.kv_heads * m.head_dim);
  const double split = m.swiglu ? 6 * ad / h + 4 * kvd / h + 10 * f / h : 10 * ad / h + 6 * f / h;
  const double stream = m.swiglu ? 16 : 12;  // the stream and the norms' outputs
  const double whole = c.sequence_parallel ? 0 : stream + (m.swiglu ? 4 : 0);
  const double per_t = split + (c.sequence_parallel ? stream : 0);
  const double scores = m.fused_attention ? 0 : 5 * static_cast<double>(m.heads) * z.s * static_cast<double>(m.seq) * z.b / z.t;
  return sbh * (whole + per_t / z.t) + scores * kActivationBytes / 2;
}

}  // namespace

int64_t analytic_memory(const ModelSize& m, const Candidate& c, int64_t global_batch, const std::string& dtype) {
  const Sizes z = sizes(m, c, global_batch, dtype);
  const double state_share = c.sharding_stage >= 1 ? static_cast<double>(z.grads) : 1;
  // State, then the activations in flight (first stage) or the head's (last).
  const double state = z.e * z.params / (c.sharding_stage == 3 ? static_cast<double>(z.grads) : 1) +
                       4 * z.params / (c.sharding_stage >= 2 ? static_cast<double>(z.grads) : 1) +
                       (8 + (dtype == "bf16" ? 4 : 0)) * z.params / state_share;
  const double sbh = z.s * z.b * z.h, a = kActivationBytes;
  // With sequence parallelism the runtime keeps the all-gathered inputs of the column-parallel
  // matmuls (q/k/v's and the MLP's first) whole for their backward, where K counts their shards.
  const double gathered_inputs = c.sequence_parallel ? 2 * sbh * (1 - 1 / z.t) * a : 0;
  const double full_layer =
      m.bf16_compute ? bf16_compute_activations(m, c, z) : layer_activations(m, c, z, a) + gathered_inputs;
  // Without recompute a frame also keeps the copy of each weight the backward reads where the
  // kernels read the weights in another dtype than stored: f32 copies of bf16 parameters under
  // f32 compute, bf16 copies of f32 ones under bf16 compute.
  const double weight_copies =
      m.bf16_compute ? (dtype == "bf16" ? 0 : 2 * z.layer_params) : (dtype == "f32" ? 0 : 4 * z.layer_params);
  const double kept_layer = z.recompute ? sbh * a / (c.sequence_parallel ? z.t : 1) : full_layer + weight_copies;
  const double first = in_flight(c, z.micro_batches) * z.layers * kept_layer + (z.recompute ? full_layer : 0);
  const double last = z.layers * kept_layer + (z.recompute ? full_layer : 0) + 4 * z.b * z.s * static_cast<double>(m.vocab) / z.t;
  const double gathered = c.sharding_stage == 3 ? 2 * z.e * z.layer_params : 0;  // a layer's gathered copy, prefetched
  return static_cast<int64_t>(state + std::max(first, last) + gathered);
}

namespace {

// One micro-batch's seconds on a device, by part: a rank's layers (`layers`), and the last stage's head.
struct MicroBatch {
  double flops_fwd = 0, flops_bwd = 0;  // the layers'
  double compute_fwd = 0, compute_bwd = 0, memory_fwd = 0, memory_bwd = 0;
  double tp_fwd = 0, tp_bwd = 0, cp_fwd = 0, cp_bwd = 0, ep_fwd = 0, ep_bwd = 0, stage3 = 0, send = 0;
  double head_flops = 0, head = 0;  // forward and backward of the head
  double forward() const { return compute_fwd + memory_fwd + tp_fwd + cp_fwd + ep_fwd + stage3 / 3; }
  double backward() const { return compute_bwd + memory_bwd + tp_bwd + cp_bwd + ep_bwd + 2 * stage3 / 3; }
};

// The pipeline message of one micro-batch (N section 4.1's scatter/gather with tp; analytic.h).
double pipeline_send(const ClusterSpec& cl, const Candidate& c, const Sizes& z, double act) {
  if (c.pp == 1) return 0;
  const int64_t stride = z.grads * c.tp;  // pp outermost
  if (c.tp == 1 || c.sequence_parallel) return ring(cl, CollectiveKind::SendRecv, act / z.t, 2, stride);
  return ring(cl, CollectiveKind::SendRecv, act / z.t, 2, stride) + ring(cl, CollectiveKind::AllGather, act, c.tp, 1);
}

MicroBatch micro_batch(const ClusterSpec& cl, const ModelSize& m, const Candidate& c, const Sizes& z,
                       const std::string& dtype) {
  MicroBatch r;
  const double b = z.b, s = z.s, h = z.h, t = z.t, layers = z.layers, e = z.e;
  const double active_mlp = static_cast<double>(mlp_params(m)) * (m.experts > 0 ? static_cast<double>(m.top_k) : 1);
  const double core = 4 * b * s * static_cast<double>(m.seq * m.heads * m.head_dim) * (m.fused_attention ? 0.5 : 1);
  const double layer_flops = (2 * b * s * (static_cast<double>(attention_params(m)) + active_mlp) + core) / t;
  const double rc = z.recompute ? 1 : 0;
  r.flops_fwd = layers * layer_flops, r.flops_bwd = (2 + rc) * layers * layer_flops;
  const std::string gemm = gemm_dtype(m, dtype);
  r.compute_fwd = compute_seconds(cl, r.flops_fwd, gemm), r.compute_bwd = compute_seconds(cl, r.flops_bwd, gemm);
  const double traffic = 2 * layers * layer_activations(m, c, z, z.e);  // written once, read once
  r.memory_fwd = memory_seconds(cl, traffic), r.memory_bwd = (2 + rc) * r.memory_fwd;
  const double act = b * s * h * e;
  const double tp_one = ring(cl, CollectiveKind::AllReduce, act, c.tp, 1);
  r.tp_fwd = 2 * layers * tp_one, r.tp_bwd = (2 + 2 * rc) * layers * tp_one;
  const double kv = b * static_cast<double>(m.seq * 2 * m.kv_heads * m.head_dim) / t * e;
  const double cp_one = ring(cl, CollectiveKind::AllGather, kv, c.cp, c.tp);
  r.cp_fwd = layers * cp_one, r.cp_bwd = (2 + rc) * layers * cp_one;
  const double ep_one = m.experts > 0 ? ring(cl, CollectiveKind::AllToAll, act * static_cast<double>(m.top_k), c.ep, c.cp * c.tp) : 0;
  r.ep_fwd = 2 * layers * ep_one, r.ep_bwd = (2 + 2 * rc) * layers * ep_one;
  if (c.sharding_stage == 3) {
    r.stage3 = 2 * ring(cl, CollectiveKind::AllGather, e * z.params, z.grads, c.tp) +
               ring(cl, CollectiveKind::ReduceScatter, 4 * z.params, z.grads, c.tp);
  }
  r.send = pipeline_send(cl, c, z, act);
  r.head_flops = 3 * 2 * b * s * h * static_cast<double>(m.vocab) / t;
  r.head = compute_seconds(cl, r.head_flops, gemm);
  return r;
}

// The data ranks' gradient sync and the embedding's, once a step.
double grad_sync(const ClusterSpec& cl, const ModelSize& m, const Candidate& c, const Sizes& z) {
  double r = 0;
  if (c.sharding_stage <= 1) r = ring(cl, CollectiveKind::AllReduce, 4 * z.params, z.grads, c.tp);
  else if (c.sharding_stage == 2) r = ring(cl, CollectiveKind::ReduceScatter, 4 * z.params, z.grads, c.tp);
  if (c.sharding_stage == 1 || c.sharding_stage == 2) r += ring(cl, CollectiveKind::AllGather, z.e * z.params, z.grads, c.tp);
  if (c.pp > 1 && m.tied)  // the first and the last stage (pp - 1 strides apart) sum the embedding's gradient
    r += ring(cl, CollectiveKind::AllReduce, 4 * static_cast<double>(m.vocab) * z.h / z.t, 2,
              (c.pp - 1) * z.grads * c.tp);
  return r;
}

}  // namespace

StepEstimate analytic_estimate(const ClusterSpec& cl, const ModelSize& m, const Candidate& c, int64_t global_batch,
                               const std::string& dtype, AnalyticTimer* timer, bool split_sends) {
  const int64_t devices = c.dp * c.tp * c.pp * c.ep * c.cp;
  SW_CHECK(devices <= cl.devices(), "plan --auto: the mesh {} needs {} devices; cluster '{}' has {}", c.mesh(), devices,
           cl.name, cl.devices());
  const Sizes z = sizes(m, c, global_batch, dtype);
  const MicroBatch u = micro_batch(cl, m, c, z, dtype);
  const double mbs = static_cast<double>(z.micro_batches);
  AnalyticTimer own;
  AnalyticTimer& sim = timer ? *timer : own;
  const auto pipe = [&](double send) {
    return sim.step(c.schedule, static_cast<int>(c.pp), static_cast<int>(z.micro_batches), c.virtual_stages, u.forward(),
                    u.backward(), send);
  };
  const double with_send = pipe(u.send), without = split_sends && u.send > 0 ? pipe(0) : with_send;
  StepEstimate r;
  r.parts["compute"] = mbs * (u.compute_fwd + u.compute_bwd + u.head);
  r.parts["memory_bound"] = mbs * (u.memory_fwd + u.memory_bwd);
  r.parts["tp_all_reduce"] = mbs * (u.tp_fwd + u.tp_bwd);
  r.parts["cp_exchange"] = mbs * (u.cp_fwd + u.cp_bwd);
  r.parts["ep_all_to_all"] = mbs * (u.ep_fwd + u.ep_bwd);
  r.parts["stage3_gather_scatter"] = mbs * u.stage3;
  r.parts["pp_send"] = with_send - without;
  r.parts["bubble"] = without - mbs * (u.forward() + u.backward());
  r.parts["grad_sync"] = grad_sync(cl, m, c, z);
  r.parts["optimizer"] = memory_seconds(cl, 7 * 4 * z.params / (c.sharding_stage >= 1 ? static_cast<double>(z.grads) : 1));
  r.step = with_send + mbs * u.head + r.parts["grad_sync"] + r.parts["optimizer"];
  r.flops = mbs * (u.flops_fwd + u.flops_bwd + u.head_flops);
  r.tokens_per_s = static_cast<double>(global_batch) * static_cast<double>(m.seq) / r.step;
  r.mfu = r.flops / r.step / cl.peak(gemm_dtype(m, dtype));
  r.memory = analytic_memory(m, c, global_batch, dtype);
  return r;
}

}  // namespace shardwise::plan
