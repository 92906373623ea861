#pragma once
// The run compared with PyTorch: shared by the exporter (tests/golden/export_parity_inputs.cc) and
// the test that replays the golden losses (tests/models/test_golden.cc).
#include <nlohmann/json.hpp>

#include "shardwise/train/trainer.h"

namespace shardwise::golden {

inline train::TrainConfig parity_config() {
  train::TrainConfig c;
  c.model.layers = 2, c.model.heads = 4, c.model.hidden = 64, c.model.seq = 12, c.model.vocab = 128;
  c.parallel.mesh = "dp=1";
  c.data.digits = 3;
  c.optimizer.steps = 20;
  c.optimizer.global_batch = 8;
  c.optimizer.lr = 3e-3, c.optimizer.min_lr = 3e-4, c.optimizer.warmup = 5;
  c.optimizer.adamw = {0.9, 0.95, 1e-8, 0.1};
  c.optimizer.clip = 1.0;
  c.optimizer.seed = 20261122;
  return c;
}

// The Llama run compared with transformers' LlamaForCausalLM (tests/golden/llama_parity.py,
// tests/models/test_llama_golden.cc): grouped-query attention (4 heads, 2 kv heads), an untied head.
inline train::TrainConfig llama_parity_config() {
  train::TrainConfig c = parity_config();
  c.model.model_type = "llama";
  c.model.kv_heads = 2;
  c.model.intermediate_size = 96;
  c.model.tie_word_embeddings = false;
  return c;
}

// The MoE Llama run compared with transformers' MixtralForCausalLM (tests/golden/llama_parity.py,
// tests/golden/moe_losses.json, tests/models/test_llama_golden.cc): MoE MLPs in both layers, 4
// experts, top-2, dropless, with the aux and z losses.
inline train::TrainConfig moe_parity_config() {
  train::TrainConfig c = llama_parity_config();
  c.model.experts = 4, c.model.top_k = 2, c.model.aux_loss = 0.02, c.model.router_z_loss = 0.001;
  return c;
}

// The GPT-2 run compared with PyTorch's CPU autocast to bf16 (tests/golden/bf16_autocast_parity.py,
// tests/golden/gpt_bf16_losses.json, tests/models/test_bf16_golden.cc): --compute bf16 with the
// unfused attention and head, the ops autocast runs (its logits are a bf16 GEMM's output).
inline train::TrainConfig bf16_parity_config() {
  train::TrainConfig c = parity_config();
  c.model.compute_dtype = DType::BF16;
  c.model.attention = "unfused", c.model.lm_head = "unfused";
  return c;
}

// What the PyTorch script reads (safetensors metadata "config"): "compute" only for bf16 compute.
inline nlohmann::json parity_config_json(const train::TrainConfig& c) {
  if (c.model.compute_dtype != DType::F32) {
    train::TrainConfig f32 = c;
    f32.model.compute_dtype = DType::F32;
    nlohmann::json j = parity_config_json(f32);
    j["compute"] = std::string(dtype_name(c.model.compute_dtype));
    return j;
  }
  if (c.model.is_llama()) {
    train::TrainConfig common = c;
    common.model.model_type = "gpt2";  // the fields both share
    nlohmann::json j = parity_config_json(common);
    j["model"] = "llama";
    j["kv_heads"] = c.model.key_value_heads();
    j["intermediate_size"] = c.model.mlp_width();
    j["rope_theta"] = c.model.rope_theta;
    j["rms_norm_eps"] = c.model.rms_norm_eps;
    j["tie_word_embeddings"] = c.model.tie_word_embeddings;
    if (c.model.experts > 0) {
      j["experts"] = c.model.experts, j["top_k"] = c.model.top_k, j["aux_loss"] = c.model.aux_loss;
      j["router_z_loss"] = c.model.router_z_loss, j["moe_layers"] = c.model.moe_layers;
      j["capacity_factor"] = c.model.capacity_factor;
    }
    j.erase("layer_norm_epsilon");
    return j;
  }
  return {{"layers", c.model.layers},   {"heads", c.model.heads},       {"hidden", c.model.hidden},
          {"seq", c.model.seq},         {"vocab", c.model.vocab},       {"layer_norm_epsilon", c.model.layer_norm_epsilon},
          {"steps", c.optimizer.steps},           {"total_steps", c.optimizer.steps},       {"lr", c.optimizer.lr},
          {"min_lr", c.optimizer.min_lr},         {"warmup", c.optimizer.warmup},           {"beta1", c.optimizer.adamw.beta1},
          {"beta2", c.optimizer.adamw.beta2},     {"epsilon", c.optimizer.adamw.epsilon},   {"weight_decay", c.optimizer.adamw.weight_decay},
          {"clip", c.optimizer.clip},             {"global_batch", c.optimizer.global_batch}, {"seed", c.optimizer.seed}};
}

}  // namespace shardwise::golden
