#pragma once
// A GPT-2-style decoder built with the graph builder: token + position embeddings, pre-LayerNorm
// blocks (causal multi-head attention, GELU MLP 4x), a final LayerNorm and an LM head tied to the
// token embedding; mean cross-entropy over the next tokens. Parallel strategies are annotations:
//   dp  ids and labels sharded on the batch
//   tp  Megatron: q/k/v and fc column-parallel, the projections row-parallel, the embedding (and so
//       the tied head) vocab-parallel
//   sp  (with tp) the residual stream and the norms sharded on the sequence over tp
// Parameter names follow Hugging Face's GPT-2 ("transformer.h.0.ln_1.weight", ...), with separate
// q/k/v projections; they are the checkpoint keys. With LoRA (config.lora, models/lora.h) every base
// parameter is frozen and the adapters ("<module>.lora_A.weight", ...) are the graph's parameters.
#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardwise/graph/graph.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/mesh/strategy.h"
#include "shardwise/tensor/tensor.h"
#include "shardwise/models/lora.h"

namespace shardwise::train {

struct CustomModel;  // models/custom.h

struct GptConfig {
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t hidden = 256;
  int64_t seq = 256;
  int64_t vocab = 256;
  double layer_norm_epsilon = 1e-5;
  double init_std = 0.02;
  DType param_dtype = DType::F32;  // f32, or bf16 (fp32 masters kept by the optimizer)
  // The GEMMs' and attention's operand dtype (--compute): f32, or bf16 with f32 accumulation and
  // f32 between the GEMMs (models/compute.h says what runs in which dtype and why).
  DType compute_dtype = DType::F32;
  // Dropout on the embeddings, the attention probabilities and both residual branches (GPT-2's
  // embd/attn/resid_pdrop) while training; masks keyed by (dropout_seed, site, sample, position).
  double dropout = 0.0;
  uint64_t dropout_seed = 0;
  // The architecture, as Hugging Face's model_type: "gpt2" (this file) or "llama" (llama.h: RMSNorm,
  // rotary positions, a SwiGLU MLP, grouped-query attention, no biases). The fields below are
  // Llama's; GPT-2 refuses them when set to anything it does not have (validate).
  std::string model_type = "gpt2";
  int64_t kv_heads = 0;           // key/value heads, dividing heads (0: as many as heads)
  int64_t head_dim = 0;           // each attention head's width (0: hidden / heads; Qwen3 checkpoints set it)
  int64_t intermediate_size = 0;  // the SwiGLU MLP's width (0: 4 x hidden)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;  // false: a separate lm_head.weight
  // Llama only: the Hugging Face family ("llama"; "qwen2": q/k/v biases; "qwen3": per-head q/k
  // RMSNorm before rotary, llama.h; "mistral": Llama's graph), which the graph and the checkpoint's
  // config.json follow.
  std::string family = "llama";
  // Mistral's sliding_window (0: none): attention is full causal over the sequence here, so
  // validate refuses a window shorter than `seq` (within the window the two are the same).
  int64_t sliding_window = 0;
  bool qkv_bias() const { return family == "qwen2"; }
  // Llama only: a Mixtral MoE MLP (ops/moe: moe_mlp) in place of the dense one in `moe_layers`
  // (empty: every layer) when experts > 0; each expert a SwiGLU MLP of mlp_width(). The loss adds
  // aux_loss x the load-balancing loss and router_z_loss x the z-loss of every MoE layer.
  // aux_loss_scope "layer": one load-balancing term per MoE layer (Switch, Megatron); "model": one
  // term of the counts and probabilities of every MoE layer pooled (transformers' Mixtral and
  // Qwen-MoE load_balancing_loss_func, which router_aux_loss_coef scales).
  int64_t experts = 0;
  int64_t top_k = 2;
  std::vector<int64_t> moe_layers;
  double aux_loss = 0.0;
  std::string aux_loss_scope = "layer";
  double router_z_loss = 0.0;
  double capacity_factor = 0.0;  // 0: dropless
  std::string router = "softmax";  // the gate scores: softmax over the experts, or sigmoid per expert
  // Qwen-MoE's shared expert beside the routed ones (0: none): a SwiGLU MLP of this width on every
  // token, scaled by sigmoid(shared_expert_gate x), added to the MoE output.
  int64_t shared_expert_width = 0;
  bool is_moe_layer(int64_t layer) const {
    return experts > 0 && (moe_layers.empty() || std::find(moe_layers.begin(), moe_layers.end(), layer) != moe_layers.end());
  }
  // The training / loss graphs' head: "fused" (lm_head_cross_entropy, the [B·S, V] logits computed
  // and dropped in row chunks) or "unfused" (matmul to the logits, then cross_entropy). Generation
  // and the prediction graph always compute the logits.
  std::string lm_head = "fused";
  // The fused head of a training graph forms its gradients in its forward (lm_head.h's
  // forward_grads: three GEMMs, no chunk of logits recomputed in the backward); the loss graph,
  // which is never differentiated, turns it off (staged.cc).
  bool head_grads_in_forward = true;
  bool is_llama() const { return model_type == "llama"; }
  int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden / heads; }
  int64_t mlp_width() const { return intermediate_size > 0 ? intermediate_size : 4 * hidden; }
  // Packed documents (--no-cross-document-attention, packing.h): the graph takes "position_ids"
  // [B, S] (first stage) and "attention_mask" [B, 1, S, S] (every stage) per micro-batch instead of
  // the positions 0..S-1 and the shared "causal_mask" [S, S]; StagedGpt computes both from the ids,
  // documents ending at token `eos_id`.
  bool document_mask = false;
  int64_t eos_id = -1;
  // Context parallelism (a cp mesh dim): every sequence is stored in cp's load-balanced order over
  // this many ranks (mesh/cp_order.h; 1: the natural order). The trainer sets it from the mesh and
  // binds ids, labels and packed documents' inputs reordered; the positions (GPT-2's position
  // embedding looked up by the "positions" constant, Llama's rotary), the causal mask and the fused
  // attention's mask follow each token's original position.
  int64_t cp_order = 1;
  // With cp, the fused attention's exchange (--cp-attention): "ring" (ring_attention: k, v blocks
  // passed around the cp ring, dk, dv sent back around; activations 1/cp) or "gather" (k, v
  // all-gathered over cp, flash_attention on the whole sequence of keys). The unfused core gathers.
  std::string cp_attention = "ring";
  // The attention core (--attention): "fused" (ops/attention's flash_attention: tiled with an online
  // softmax, nothing [S, S] kept for the backward; packed documents take "document_ids" [B, S]
  // instead of "attention_mask", and no "causal_mask" is needed) or "unfused" (scores, mask add,
  // softmax, dropout and probs x V as separate ops, for comparison).
  std::string attention = "fused";
  bool fused_attention() const { return attention == "fused"; }
  LoraConfig lora;  // rank 0: no adapters
  // A model built elsewhere (the Python package's modules, models/custom.h): its builder and
  // initial values replace GPT-2's; null for the built-in models.
  std::shared_ptr<const CustomModel> custom;
  // Activation recompute while training (graph/recompute.h): "none"; "full" keeps each layer's
  // input only and recomputes the layer before its backward; "selective" recomputes the attention
  // core only (scores, mask, softmax, attention dropout, probs x V), as Megatron-LM's selective
  // recompute; fused attention keeps nothing [S, S] for its backward, so there selective marks no
  // segment (it is none). `recompute_layers` N: only the first N layers of each stage (-1: every layer).
  std::string recompute = "none";
  int64_t recompute_layers = -1;
  // Whether the builder marks the layer at `index` among its stage's layers (0: the stage's first)
  // as a full or a selective recompute segment.
  bool recompute_full(int64_t index) const { return recompute == "full" && recomputes(index); }
  bool recompute_selective(int64_t index) const {
    return recompute == "selective" && !fused_attention() && recomputes(index);
  }
  bool recomputes(int64_t index) const { return recompute != "none" && (recompute_layers < 0 || index < recompute_layers); }
  void validate() const;  // Error naming the bad field (LoRA's too: lora_modules)
  bool operator==(const GptConfig&) const = default;
};

using mesh::Strategy;

struct GptGraph {
  graph::Graph g;
  graph::ValueId loss = -1;         // training graph: mean cross-entropy
  graph::ValueId loss_sum = -1;     // training graph: the summed cross-entropy (loss = loss_sum / (B * S))
  graph::ValueId predictions = -1;  // evaluation graph: argmax of the logits [B, S] i64
  int64_t sequences = 0;  // of the micro-batch, over all the data ranks (dp x ep)
  // A pipeline stage's part: the residual stream it receives ("stage_input"), the one it sends on
  // and the input that receives the gradient of the latter ("<output>@grad_in"); -1 when absent.
  graph::ValueId input = -1, output = -1, output_grad = -1;
  // A training stage without the head: its own term of the loss (a Llama's MoE router losses), -1
  // when none (pipeline::StageSpec::extra_loss).
  graph::ValueId extra_loss = -1;
};

// The part of the model a pipeline stage builds: layers [first_layer, end_layer) (end -1: to the
// last), with the embeddings (first stage) and the head and loss (last stage). Default: all of it.
struct GptPart {
  int64_t first_layer = 0, end_layer = -1;
  bool embeddings = true, head = true;
};

// The graph of one micro-batch of `sequences` sequences on the whole dp dim (inputs "ids" [B, S] i64, "labels"
// [B, S] i64 for training, "causal_mask" [S, S]), annotated for `strategy`. With `training` the
// output is the loss, else the greedy next-token predictions. Errors name what does not divide.
// With a `part` the graph is a pipeline stage's: the residual stream enters and leaves it in the
// layout of the stage boundary (batch on dp; sequence on tp with sp, else replicated on tp).
// Dropout with probability `p` at a named site (its own random stream, keyed by the config's
// dropout seed); the identity when not training or p = 0. Both builders' dropout.
graph::ValueId dropout_at(graph::Graph& g, const GptConfig& config, bool training, graph::ValueId v,
                          const std::string& site, double p);

// The attention core of both builders as separate ops (--attention unfused): q scaled by 1/sqrt(head
// dim) before q k^T rather than the [S, S] scores after it (a quarter of the elements for S = 4 HD,
// and the same numbers when the factor is a power of 2), the additive mask, softmax, attention
// dropout, probs x V; with `selective` the core after the scaling is a recompute segment. Values
// are named `<prefix>.q.scaled`, `.scores`, `.masked`, `.probs`, `.dropout`, `.ctx.heads`.
graph::ValueId unfused_attention(graph::Graph& g, const GptConfig& config, bool training, graph::ValueId q,
                                 graph::ValueId k, graph::ValueId v, graph::ValueId mask, const std::string& prefix,
                                 bool selective);

// The fused attention core of both builders: flash_attention(q, k, v) (flash_attention_docs with
// `doc` >= 0, the per-token document ids [B, S]) with scale 1/sqrt(head dim) and, while training,
// attention dropout keyed as the `dropout` op at `dropout_site` would key it. Returns the output.
graph::ValueId fused_attention(graph::Graph& g, const GptConfig& config, bool training, graph::ValueId q,
                               graph::ValueId k, graph::ValueId v, graph::ValueId doc, const std::string& name,
                               const std::string& dropout_site);

GptGraph build_gpt(const GptConfig& config, const Strategy& strategy, int64_t sequences, bool training = true,
                   const GptPart& part = {});

// The head of a training (loss) graph from the final normed hidden states x [B, S, H] and the
// head's weight w [V, H] (tied or not): "labels" [B, S], out.loss_sum (the summed cross-entropy,
// fused or not as config.lm_head says; vocab-parallel with tp) and out.loss = loss_sum / (B * S);
// without `training` the logits and out.predictions (their argmax). GPT-2's and Llama's builders share it.
// `loss_name`: the name of out.loss (Llama's MoE adds its router losses to a "loss.ce").
void head_loss(graph::Graph& g, const GptConfig& config, const Strategy& strategy, graph::ValueId x,
               graph::ValueId w, bool training, GptGraph& out, const std::string& loss_name = "loss");

// The initial value of a parameter: normal(0, std) from Philox keyed by (seed, name) at each
// global element index (so any sharding holds the same numbers); std = init_std, and
// init_std / sqrt(2 * layers) for the residual projections (GPT-2); LayerNorm weight 1, biases 0;
// LoRA's A and B as init_lora_block draws them.
Tensor init_param(const GptConfig& config, const std::string& name, const Shape& shape, uint64_t seed);
// The same numbers for one block [offset, offset + block) of the parameter only.
Tensor init_param_block(const GptConfig& config, const std::string& name, const Shape& shape,
                        std::span<const int64_t> offset, const Shape& block, uint64_t seed);

// normal(0, std) from Philox keyed by (seed, name) at each global element index, for the block
// [offset, offset + block) of a parameter of `shape` (init_param_block's draw, and a Python model's).
Tensor normal_param_block(const std::string& name, const Shape& shape, std::span<const int64_t> offset,
                          const Shape& block, uint64_t seed, double std);

// The [S, S] additive causal mask: 0 on and below the diagonal, -1e9 above; with cp_order c > 1
// of the sequence stored in cp's balanced order over c ranks (0 where key j's original position is
// at most query i's).
Tensor causal_mask(int64_t seq, int64_t cp_order = 1);

}  // namespace shardwise::train
