// Writes what the PyTorch reference (tests/golden/gpt_parity.py; llama_parity.py) needs to train
// the same model as tests/models/test_golden.cc (test_llama_golden.cc): the initial parameters as
// shardwise initializes them, the batches of every step, and the configuration (safetensors
// __metadata__ "config", JSON).
//
//   build/tests/golden_export OUT.safetensors [gpt2|llama|moe|gpt2-bf16]
//   (`make golden`, `make llama-golden`, `make bf16-golden`)
#include <iostream>

#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/graph/graph.h"
#include "shardwise/models/models.h"
#include "tests/golden/parity_config.h"

int main(int argc, char** argv) {
  using namespace shardwise;
  const std::string kind = argc == 3 ? argv[2] : "gpt2";
  if ((argc != 2 && argc != 3) || (kind != "gpt2" && kind != "llama" && kind != "moe" && kind != "gpt2-bf16")) {
    std::cerr << "usage: golden_export OUT.safetensors [gpt2|llama|moe|gpt2-bf16]\n";
    return 2;
  }
  train::TrainConfig c = kind == "moe"         ? golden::moe_parity_config()
                         : kind == "llama"     ? golden::llama_parity_config()
                         : kind == "gpt2-bf16" ? golden::bf16_parity_config()
                                               : golden::parity_config();
  c.check(1);
  train::GptGraph model =
      train::build_model(c.model, train::Strategy::from_mesh(mesh::parse_mesh(c.parallel.mesh), false), c.optimizer.global_batch);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (graph::ValueId v : model.g.params()) {
    const auto& val = model.g.value(v);
    tensors.emplace_back(val.name, train::init_model_param(c.model, val.name, val.meta.shape, c.optimizer.seed));
  }
  auto data = train::open_dataset(c.data.files, c.data.digits, c.model.seq, c.optimizer.seed);
  for (int64_t s = 0; s < c.optimizer.steps; ++s) {
    train::Batch b = train::make_batch(*data, s * c.optimizer.global_batch, c.optimizer.global_batch, c.model.seq);
    tensors.emplace_back(fmt::format("batch.{}.ids", s), b.ids);
    tensors.emplace_back(fmt::format("batch.{}.labels", s), b.labels);
  }
  std::vector<ckpt::StEntry> entries;
  for (auto& [name, t] : tensors) entries.push_back(ckpt::entry_of(name, t));
  ckpt::write_safetensors(argv[1], entries, ckpt::StMetadata{{"config", golden::parity_config_json(c).dump()}});
  std::cout << "wrote " << tensors.size() << " tensors to " << argv[1] << "\n";
  return 0;
}
