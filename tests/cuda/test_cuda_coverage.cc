// Which ops of a training step have no CUDA kernel bound yet (cuda_ops/bind.h): the forward and
// gradient ops of the GPT-2, Llama and Mixtral training programs (dp=1 and tp=2: tp's programs use
// the vocab-parallel head) and of generation's prefill and decode step, against the CUDA table. A
// static listing (nothing runs on a GPU): it must equal tests/cuda/missing_cuda_kernels.txt, so the
// list shrinks only deliberately, as kernels are bound. Built only where CUDA is (test_cuda).
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>

#include "shardwise/cuda_ops/bind.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/models/models.h"

namespace shardwise {
namespace {

using train::GptConfig;

GptConfig tiny(const std::string& type) {
  GptConfig c;
  c.layers = 2, c.heads = 4, c.hidden = 32, c.seq = 8, c.vocab = 128;
  if (type == "gpt2") return c;
  c.model_type = "llama";
  c.kv_heads = 2, c.intermediate_size = 64, c.tie_word_embeddings = false;
  if (type == "mixtral") c.experts = 4, c.top_k = 2, c.aux_loss = 0.01, c.router_z_loss = 0.001;
  return c;
}

// "forward <op>" and "backward <op>" for every node of `g`; "fill nonzero" for a Fill of another
// value than 0 (bound when the table has a fill: the CUDA one fills any value).
void add_ops(const graph::Graph& g, std::set<std::string>& used) {
  for (const graph::Node& n : g.nodes()) {
    if (n.kind == graph::NodeKind::Forward) used.insert("forward " + n.op);
    if (n.kind == graph::NodeKind::Backward) used.insert("backward " + n.op);
    if (n.kind == graph::NodeKind::Fill && n.attrs.get_float("value", 0.0) != 0.0) used.insert("fill nonzero");
  }
}

std::set<std::string> step_ops() {
  std::set<std::string> used;
  for (const std::string type : {"gpt2", "llama", "mixtral"}) {
    const GptConfig c = tiny(type);
    for (const char* mesh : {"dp=1", "tp=2"}) {
      const mesh::Strategy s = mesh::Strategy::from_mesh(mesh::parse_mesh(mesh), false);
      train::GptGraph gpt = train::build_model(c, s, 2);
      graph::append_backward(gpt.g, gpt.loss);
      add_ops(gpt.g, used);
      GptConfig bf16 = c;  // --compute bf16: the ops' bf16 forms (step_dtype_ops lists them by dtype)
      bf16.compute_dtype = DType::BF16;
      train::GptGraph b = train::build_model(bf16, s, 2);
      graph::append_backward(b.g, b.loss);
      add_ops(b.g, used);
      add_ops(train::build_model_prefill(c, s, 2, c.seq).g, used);
      add_ops(train::build_model_decode_step(c, s, 2, c.seq).g, used);
    }
  }
  return used;
}

TEST(CudaCoverage, MissingKernelsOfTheTrainingAndGenerationStepsAreTheCheckedInList) {
  const auto table = cuda_ops::cuda_kernel_table();
  std::set<std::string> bound;
  for (const std::string& op : table->forward_ops()) bound.insert("forward " + op);
  for (const std::string& op : table->backward_ops()) bound.insert("backward " + op);
  if (table->fill() != nullptr) bound.insert("fill nonzero");  // the table's fill takes any value
  std::string missing;
  for (const std::string& op : step_ops()) {
    if (!bound.contains(op)) missing += op + "\n";
  }
  std::cout << "ops of the steps without a CUDA kernel:\n" << missing;
  std::ifstream in(SHARDWISE_SOURCE_DIR "/tests/cuda/missing_cuda_kernels.txt");
  ASSERT_TRUE(in) << "tests/cuda/missing_cuda_kernels.txt is missing";
  std::stringstream expected;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') expected << line << "\n";
  }
  EXPECT_EQ(missing, expected.str())
      << "the ops without a CUDA kernel changed: update tests/cuda/missing_cuda_kernels.txt to the list above";
}

TEST(CudaCoverage, EveryBoundKernelIsAnOpOfTheRegistry) {
  const auto table = cuda_ops::cuda_kernel_table();
  for (const std::string& op : table->forward_ops()) EXPECT_NE(ops::op_registry().find(op), nullptr) << op;
  for (const std::string& op : table->backward_ops()) EXPECT_NE(ops::op_registry().find(op), nullptr) << op;
}

}  // namespace
}  // namespace shardwise
