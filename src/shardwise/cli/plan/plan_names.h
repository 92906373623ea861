#pragma once
// `shardwise plan` names tensors as checkpoints do. GPT-2's model keeps q, k and v as separate
// parameters (attn.q_proj, ...) that its checkpoints store side by side in attn.c_attn
// (models/model_io.h's key map): the plan shows the parameter transformer.h.0.attn.q_proj.weight as
// transformer.h.0.attn.c_attn.weight(q) and the values computed from it (q_proj.mm, q_proj.out) as
// transformer.h.0.attn.c_attn(q).mm, .out. Names the key map does not place stay as they are
// (they are the checkpoint's: Llama's, the MLP's, the norms').
#include <map>
#include <string>
#include <string_view>

#include "shardwise/models/gpt.h"

namespace shardwise::cli {

class CheckpointNames {
 public:
  explicit CheckpointNames(const train::GptConfig& config);
  // `text` with every graph name that the checkpoint names otherwise replaced by that name.
  std::string rename(std::string_view text) const;
  // The graph's name of a name as rename() shows it (either form is accepted).
  std::string graph_name(std::string_view shown) const;
  // One line on what "(q)" means, or "" when nothing is renamed.
  std::string legend() const;

 private:
  std::string shown(std::string_view name) const;
  std::map<std::string, std::string, std::less<>> params_;    // q_proj.weight -> c_attn.weight(q)
  std::map<std::string, std::string, std::less<>> prefixes_;  // ...attn.q_proj -> ...attn.c_attn(q)
};

}  // namespace shardwise::cli
